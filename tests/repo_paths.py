"""Where things are, for every test and worker in whatever folder of tests/ it lies: the repository, its src/,
tests/ (the helpers every test shares: tiny.py, dist_exit.py, ...) and tests/workers/ (the scripts tests run as
processes). Tests import each other's helpers by module name (``from test_resume import train``) from any folder:
:func:`put_on_path` (conftest.py calls it; a worker too, after putting tests/ on its path) makes that work."""

import os
import sys

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SRC = os.path.join(REPO, "src")
WORKERS = os.path.join(TESTS, "workers")
# tests/, then each topic folder of it, workers/ included
IMPORT_PATHS = [TESTS, *sorted(e.path for e in os.scandir(TESTS) if e.is_dir() and e.name[0] not in "._")]


def put_on_path() -> None:
    """Put every folder of IMPORT_PATHS that sys.path lacks on it, just after tests/ (or at the end)."""
    missing = [p for p in IMPORT_PATHS if p not in sys.path]
    at = sys.path.index(TESTS) + 1 if TESTS in sys.path else len(sys.path)
    sys.path[at:at] = missing


def script_path(name: str) -> str:
    """The path of a script a test runs (``ddp_worker.py``): ``name`` itself when it is a path, else the first
    folder of tests/ that holds it, workers/ first."""
    if os.path.dirname(name):
        return name
    for folder in [WORKERS, *IMPORT_PATHS]:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return os.path.join(WORKERS, name)


def find_test_file(name: str) -> str:
    """The path of the test file ``name`` (``test_resume.py``) in whichever folder of tests/ it lies."""
    for folder in IMPORT_PATHS:
        if os.path.isfile(os.path.join(folder, name)):
            return os.path.join(folder, name)
    return os.path.join(TESTS, name)
