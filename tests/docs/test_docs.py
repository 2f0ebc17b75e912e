"""Every code block of README.md and docs/*.md runs as written (tests/doc_blocks.py says which and how), each page
in a fresh process and an empty folder; the pages' links point at files and headings that exist; and the pages name
no internal issue numbers or test machines (nor do the code's docstrings, comments and printed text)."""

import dataclasses
import os
import re
import subprocess
import sys

import pytest

import conftest
from doc_blocks import PAGES, ROOT, blocks

# pages whose commands start fresh processes that import transformers (and trl, torchrun): over 20 s here
SLOW = {"docs/getting-started.md", "docs/cli.md", "docs/libraries.md", "docs/distributed.md"}


def page_id(page):
    return page.name if page.parent == ROOT else f"docs/{page.name}"


@pytest.mark.parametrize("page", [pytest.param(p, id=page_id(p), marks=[pytest.mark.slow] if page_id(p) in SLOW else [])
                                  for p in PAGES])
def test_page_blocks_run(page, tmp_path):
    if not any(b.kind in ("exec", "file", "bash") for b in blocks(page)):
        pytest.skip("no block to run")
    # What a user's shell has after activating the venv, and no more: the runner puts the venv's bin/ first on PATH;
    # PYTHONPATH only makes this checkout's cadence the one imported (a clone's venv has it installed from here).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "doc_blocks.py"), str(page)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def test_blocks_counted_and_nearly_all_run():
    """At least 90% of the blocks that are code or commands run; each one that does not says why. The counts and the
    reasons are printed in the run's summary."""
    ran, not_run = 0, []
    for page in PAGES:
        for block in blocks(page):
            if block.kind in ("exec", "file", "bash"):
                ran += 1
            elif block.kind == "not run":
                assert block.note, f"{page_id(page)} line {block.line}: '<!-- not run: -->' needs a reason"
                not_run.append(f"{page_id(page)} line {block.line}: {block.note}")
            else:
                assert block.lang in ("bash", ""), f"{page_id(page)} line {block.line}: a ```{block.lang} block"
    conftest.SUMMARY_LINES.append(f"docs code blocks: {ran} run as pasted, {len(not_run)} marked not run:")
    conftest.SUMMARY_LINES.extend(f"  {n}" for n in not_run)
    assert ran >= 0.9 * (ran + len(not_run)) and ran >= 20


def test_site_nav_lists_every_page():
    """The site (mkdocs.yml) shows every page of docs/ in its navigation, and nothing else."""
    nav = set(re.findall(r"^\s*- (?:[^:\n]+: )?([\w.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert nav == pages, f"not in the nav: {sorted(pages - nav)}; in the nav but missing: {sorted(nav - pages)}"


def test_training_arguments_reference_names_every_field():
    """The reference page's field list is generated from the dataclass (scripts/docs_hooks.py, at every site build):
    every field is a row, under a group, and cadence's own fields are marked."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import docs_hooks
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    from cadence import TrainingArguments
    from cadence.training_args import CADENCE_ONLY

    page = (ROOT / "docs" / "reference-training-arguments.md").read_text(encoding="utf-8")
    assert docs_hooks.MARKER in page
    text = docs_hooks.on_page_markdown(page, None, None, None)
    rows = re.findall(r"^\| `(\w+)`( \*\*\(cadence only\)\*\*)? \|", text, re.M)
    assert [name for name, _ in rows] == [f.name for f in dataclasses.fields(TrainingArguments)]
    assert {name for name, own in rows if own} == set(CADENCE_ONLY)
    assert text.count("\n### ") >= 10  # grouped


def _anchor(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_links_resolve():
    bad = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                bad.append(f"{page_id(page)}: {target} (a link outside the repository)")
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if page.parent.name == "docs" and path and not file.is_relative_to(ROOT / "docs"):
                bad.append(f"{page_id(page)}: {target} (outside docs/: the site has no such page; name the file in text)")
                continue
            if not file.exists():
                bad.append(f"{page_id(page)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
                if anchor not in anchors:
                    bad.append(f"{page_id(page)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_no_internal_references():
    """Issue numbers of the team's tracker, its test machines, files outside the repository, the paths of the machine
    that ran something and raw library error texts mean nothing to a reader of the docs (benchmarks/README.md too), nor
    of the code's docstrings, comments and printed text (benchmarks/, scripts/, src/): an upstream issue is cited by its
    full URL."""
    code = [*sorted((ROOT / "benchmarks").glob("*.py")), *sorted((ROOT / "scripts").glob("*.py")),
            *sorted((ROOT / "src").rglob("*.py"))]
    assert len(code) > 100 and ROOT / "src" / "cadence" / "trainer.py" in code
    bad = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md", *code]:
        patterns = [r"(?<!PyTorch )\bissues? #?\d+", r"\(#\d+\)", r"\| #\d+ \|", r"\.\./shared", r"\bVM\b",
                    r"lent GPU", r"DESIGN\.md", r"\brun\(command=", r"(?<![\w.])/(?:work|root|home)/",
                    r"third_party/gloo"]
        if page.suffix == ".py":
            patterns.append(r"[\"']#\d+[\"' ]")  # a ticket number as a printed label ("#21")
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in patterns:
                if re.search(pattern, line, re.I):
                    bad.append(f"{page.relative_to(ROOT)} line {number}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150
