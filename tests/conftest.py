import ast
import functools
import os
import re
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import repo_paths  # noqa: E402

repo_paths.put_on_path()  # tests/'s topic folders: tests import each other's helpers by name, from any folder

# comet_ml, once imported (transformers' Trainer imports it when it is installed), patches mlflow and writes an
# offline Comet experiment into the working directory for every MLflow run: off for the tests
os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
# one thread by default (the suite's machines are shared); OMP_NUM_THREADS=2 runs it on two, to show that no
# test's equality depends on the thread count
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "out")


# Lines a test leaves for the end of the run (tests/docs/test_docs.py: how many docs blocks ran and which are marked not
# run, with why), shown in the terminal summary so CI's log has them without `pytest -s`.
SUMMARY_LINES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if SUMMARY_LINES:
        terminalreporter.write_sep("=", "summary")
        for line in SUMMARY_LINES:
            terminalreporter.write_line(line)


# what starts another process, in a test's source or a helper's it calls: such a test gets the marker "processes"
# (torch's own DataLoader workers are not counted)
STARTS_PROCESSES = re.compile(r"\bsubprocess\.|\bPopen\(|\blaunch\(|multiprocessing\.(?:Process|Pool|get_context)|"
                              r"\bmp\.spawn\(|os\.fork\(|torch\.distributed\.run|ray\.init\(|ProcessPoolExecutor")
_starters = {}


def _names(node) -> set:
    """Every name and attribute a definition uses."""
    return {n.id if isinstance(n, ast.Name) else n.attr
            for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute))}


@functools.lru_cache(maxsize=None)
def parsed(path: str):
    source = Path(path).read_text(encoding="utf-8")
    return source, ast.parse(source)


def starters(path) -> set:
    """The module-level functions and classes of the file ``path`` that start a process, themselves or through
    another one (a helper, a fixture; a name imported from a helper or test module of tests/ counts with its own)."""
    path = str(path)
    if path not in _starters:
        _starters[path] = set()  # (an import cycle between test modules ends here)
        source, tree = parsed(path)
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        found = {name for name, n in defs.items() if STARTS_PROCESSES.search(ast.get_source_segment(source, n))}
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                other = repo_paths.find_test_file(node.module + ".py")
                if os.path.isfile(other):
                    theirs = starters(other)
                    found |= {a.asname or a.name for a in node.names if a.name in theirs}
        while True:
            more = {name for name, n in defs.items() if name not in found and _names(n) & found}
            if not more:
                break
            found |= more
        _starters[path] = found
    return _starters[path]


def pytest_collection_modifyitems(config, items):
    """Mark "processes" each test that starts another process, itself, through a helper or through a fixture of its
    file (``pytest -m 'not processes'`` leaves them out)."""
    for item in items:
        try:
            found = starters(item.path)
            source, tree = parsed(str(item.path))
            name = item.cls.__name__ if getattr(item, "cls", None) else getattr(item, "originalname", item.name)
            node = next(n for n in tree.body if getattr(n, "name", None) == name)
            starts = bool(STARTS_PROCESSES.search(ast.get_source_segment(source, node)) or _names(node) & found
                          or set(getattr(item, "fixturenames", ())) & found)
        except (OSError, SyntaxError, StopIteration):  # not a plain test function of a file: the whole file decides
            starts = bool(STARTS_PROCESSES.search(Path(item.path).read_text(encoding="utf-8")))
        if starts:
            item.add_marker(pytest.mark.processes)
