"""The code blocks of README.md and docs/*.md, and a runner for one page (a fresh process: a page may patch
transformers, which must not leak into the test process).

    python tests/doc_blocks.py PAGE        # run PAGE's blocks in order, in the current (empty) folder

Each page runs as a user would paste it into a fresh folder: nothing is defined but what the page shows (a page may
have a visible set-up block), the folder is the first entry of ``sys.path`` (as in an interactive ``python``), and the
interpreter's ``bin/`` (the venv's: its ``python``, ``cadence``, ``torchrun``) comes first on ``PATH``.

What runs, in the page's order:
- every ```python block, in one namespace per page, as if pasted into one ``python`` session;
- a ```python block right after ``<!-- file: NAME -->`` is written to NAME instead (a later bash block runs it);
- every ```bash block whose first command is ``cadence``, ``python``, ``torchrun`` or ``mv``, with ``bash -euo pipefail``.
A block right after ``<!-- not run: REASON -->`` is skipped; other bash blocks (``make``, ``pip``) are not commands
the tests run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = ("cadence", "python", "torchrun", "mv")
_BLOCK = re.compile(r"(?:<!--\s*(?P<mark>[^>]*?)\s*-->\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M)


@dataclass
class Block:
    lang: str
    code: str
    line: int
    kind: str  # "exec", "file", "bash", "not run", "not a command"
    note: str = ""  # the file name, or the reason it is not run


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    out = []
    for match in _BLOCK.finditer(text):
        lang, code, mark = match["lang"], match["code"], (match["mark"] or "")
        line = text.count("\n", 0, match.start("code")) + 1
        if mark.startswith("not run:"):
            out.append(Block(lang, code, line, "not run", mark[len("not run:"):].strip()))
        elif lang == "python":
            if mark.startswith("file:"):
                out.append(Block(lang, code, line, "file", mark[len("file:"):].strip()))
            else:
                out.append(Block(lang, code, line, "exec"))
        elif lang == "bash" and _first_word(code) in COMMANDS:
            out.append(Block(lang, code, line, "bash"))
        else:
            out.append(Block(lang, code, line, "not a command"))
    return out


def _first_word(code: str) -> str:
    lines = [line.strip() for line in code.splitlines() if line.strip() and not line.strip().startswith("#")]
    return lines[0].split()[0] if lines else ""


def run_page(page: Path) -> None:
    # As pasted into a `python` started in this folder: the folder first on sys.path, not tests/ (this script's own
    # folder), so a page cannot lean on the test helpers. This checkout's src/ stays importable through PYTHONPATH
    # (the caller sets it; in a clone's venv cadence is installed from there anyway).
    sys.path[:] = ["", *(p for p in sys.path[1:] if Path(p or ".").resolve() != Path(__file__).resolve().parent)]
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env["PATH"]])  # the venv's bin/, as activated
    namespace = {"__name__": "__main__"}
    for block in blocks(page):
        where = f"{page.relative_to(ROOT)} line {block.line}"
        print(f"--- {where}: {block.kind} {block.note}", flush=True)
        if block.kind == "exec":
            exec(compile(block.code, where, "exec"), namespace)  # noqa: S102 - the page's own example
        elif block.kind == "file":
            Path(block.note).write_text(block.code, encoding="utf-8")
        elif block.kind == "bash":
            proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], env=env)
            if proc.returncode != 0:
                raise SystemExit(f"{where}: the bash block exited with {proc.returncode}:\n{block.code}")


if __name__ == "__main__":
    run_page(Path(sys.argv[1]).resolve())
