"""What the example-script tests share: run a script on cadence and on transformers (the library chosen by the
script's own variable), then on cadence again resumed from a copy of one of its checkpoints; read its JSON outputs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest


def read(out: Path, name: str):
    return json.loads((out / name).read_text())


def runs_on_both_libraries(root: Path, main: Callable, lib_variable: str, argv: Callable[[Path], list],
                           resume_from: str = "checkpoint-8") -> dict:
    """{"cadence" | "transformers" | "resumed": (output folder, what ``main`` returned)}, offline datasets."""

    def run(lib, args):
        os.environ[lib_variable] = lib
        try:
            return main(args)
        finally:
            del os.environ[lib_variable]

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = {}
    try:
        for lib in ("cadence", "transformers"):
            out = root / lib / "out"
            result[lib] = (out, run(lib, argv(out)))
        resumed = root / "resumed" / "out"
        resumed.mkdir(parents=True)
        shutil.copytree(root / "cadence" / "out" / resume_from, resumed / resume_from)
        result["resumed"] = (resumed, run("cadence", argv(resumed) + ["--resume_from_checkpoint",
                                                                     str(resumed / resume_from)]))
    finally:
        monkeypatch.undo()
    return result
