"""Every code block of README.md and docs/*.md runs as written (tests/doc_blocks.py says which and how), each page
in a fresh process and an empty folder; the pages' links point at files and headings that exist; and the pages name
no internal issue numbers or test machines."""

import os
import re
import subprocess
import sys

import pytest

from doc_blocks import PAGES, ROOT, blocks

# pages whose commands start fresh processes that import transformers (and trl, torchrun): over 20 s here
SLOW = {"README.md", "docs/cli.md", "docs/libraries.md", "docs/distributed.md"}


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
    """At least 90% of the blocks that are code or commands run; each one that does not says why."""
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
    print(f"\ndocs code blocks: {ran} run, {len(not_run)} marked not run" + "".join(f"\n  {n}" for n in not_run))
    assert ran >= 0.9 * (ran + len(not_run)) and ran >= 20


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
            if not file.exists():
                bad.append(f"{page_id(page)}: {target} (no such file)")
            elif anchor and file.suffix == ".md":
                anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", file.read_text(encoding="utf-8"), re.M)}
                if anchor not in anchors:
                    bad.append(f"{page_id(page)}: {target} (no such heading)")
    assert not bad, "\n".join(bad)


def test_no_internal_references():
    """Issue numbers of the team's tracker, its test machines, files outside the repository, the paths of the machine
    that ran something and raw library error texts mean nothing to a reader of the docs (benchmarks/README.md too)."""
    bad = []
    for page in [*PAGES, ROOT / "benchmarks" / "README.md"]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for pattern in (r"(?<!PyTorch )\bissues? #?\d+", r"\(#\d+\)", r"\| #\d+ \|", r"\.\./shared", r"\bVM\b",
                            r"lent GPU", r"DESIGN\.md", r"\brun\(command=", r"(?<![\w.])/(?:work|root|home)/",
                            r"third_party/gloo"):
                if re.search(pattern, line, re.I):
                    bad.append(f"{page.relative_to(ROOT)} line {number}: {line.strip()[:100]}")
    assert not bad, "\n".join(bad)


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 150
