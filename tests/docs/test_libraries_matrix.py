"""The README's list of library trainers that run on cadence, checked against the matrix's last table
(docs/libraries-matrix.json, written by ``make test-libraries``): every trainer it names is a row of that library at
that version, equal to transformers; the main pins (constraints.txt) are the versions the rows ran."""

from __future__ import annotations

import json
import re
from pathlib import Path
from repo_paths import REPO

ROOT = Path(REPO)
# "TRL 1.16.0's `SFTTrainer`, `DPOTrainer`;": a library, its version, the trainers claimed for it
CLAIM = re.compile(r"(TRL|sentence-transformers|setfit|GLiNER|PyLate|SpanMarker) (\d[\w.]*)'s ((?:`\w+`,?\s*)+)")
PACKAGE = {"TRL": "trl", "sentence-transformers": "sentence-transformers", "setfit": "setfit", "GLiNER": "gliner",
           "PyLate": "pylate", "SpanMarker": "span-marker"}


def readme_claims(text: str) -> list[tuple[str, str, str]]:
    section = text.split("## TRL, sentence-transformers and other libraries", 1)[1].split("\n## ", 1)[0]
    section = " ".join(section.split())  # the list wraps over lines
    return [(PACKAGE[lib], version, trainer) for lib, version, names in CLAIM.findall(section)
            for trainer in re.findall(r"`(\w+)`", names)]


def pins() -> dict[str, str]:
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line and not line.startswith("#"))


def test_readme_claims_are_equal_rows_of_the_matrix():
    claims = readme_claims((ROOT / "README.md").read_text())
    assert len(claims) >= 10, claims  # TRL's 7 stable trainers and sentence-transformers' 3 at least
    rows = json.loads((ROOT / "docs" / "libraries-matrix.json").read_text())["rows"]
    by_name = {(r["library"], r["trainer"]): r for r in rows}
    for library, version, trainer in claims:
        row = by_name.get((library, trainer))
        assert row is not None, f"the README names {library} {trainer}, which the matrix has no row for"
        assert row["version"] == version, f"{library} {trainer}: README {version}, matrix {row['version']}"
        assert row["verdict"] == "equal", f"the README claims {library} {trainer}; the matrix says {row}"


def test_main_pin_rows_ran_the_pinned_versions():
    """Rows of the libraries in the main venv ran the versions constraints.txt pins (and its transformers), and
    the README names those versions."""
    pinned = pins()
    rows = json.loads((ROOT / "docs" / "libraries-matrix.json").read_text())["rows"]
    for row in rows:
        if row["library"] in ("trl", "sentence-transformers") and row["version"]:
            assert row["version"] == pinned[row["library"]], row
            assert row["transformers"] == pinned["transformers"], row
    for library, version, _ in readme_claims((ROOT / "README.md").read_text()):
        if library in pinned:
            assert version == pinned[library], (library, version)


def test_docs_libraries_page_names_only_matrix_trainers():
    """docs/libraries.md's list of TRL trainers are rows of the matrix."""
    text = (ROOT / "docs" / "libraries.md").read_text()
    listed = re.search(r"TRL \(((?:`\w+`,?\s*)+)\)", text)
    assert listed, "docs/libraries.md no longer lists TRL's trainers as '(`SFTTrainer`, ...)'"
    trainers = {(r["library"], r["trainer"]) for r in
                json.loads((ROOT / "docs" / "libraries-matrix.json").read_text())["rows"]}
    for name in re.findall(r"`(\w+)`", listed.group(1)):
        assert ("trl", name) in trainers, name


def test_every_row_of_the_matrix_is_equal_or_says_why_it_cannot_run():
    """The README says each row of the matrix is equal to transformers or gives the reason it cannot run here: the
    last table holds no row that differs or that nothing covers, and each that cannot run names why."""
    rows = json.loads((ROOT / "docs" / "libraries-matrix.json").read_text())["rows"]
    assert rows
    for row in rows:
        assert row["verdict"] in ("equal", "cannot run here"), row
        if row["verdict"] == "cannot run here":
            assert row["start"].strip(), row
