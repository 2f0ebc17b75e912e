import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
# comet_ml, once imported (transformers' Trainer imports it when it is installed), patches mlflow and writes an
# offline Comet experiment into the working directory for every MLflow run: off for the tests
os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
# one thread by default (the suite's machines are shared); OMP_NUM_THREADS=2 runs it on two, to show that no
# test's equality depends on the thread count
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@pytest.fixture
def out_dir(tmp_path):
    return str(tmp_path / "out")


# Lines a test leaves for the end of the run (tests/test_docs.py: how many docs blocks ran and which are marked not
# run, with why), shown in the terminal summary so CI's log has them without `pytest -s`.
SUMMARY_LINES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if SUMMARY_LINES:
        terminalreporter.write_sep("=", "summary")
        for line in SUMMARY_LINES:
            terminalreporter.write_line(line)
