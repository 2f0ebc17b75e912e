"""Runs one of the example scripts in tests/ under torchrun: ``example_worker.py MODULE ARGS...``, checking at exit
that cadence ended its process group (``dist_exit``); the library comes from the script's own variable."""

import importlib
import sys

from dist_exit import finish_at_exit

if __name__ == "__main__":
    finish_at_exit()
    importlib.import_module(sys.argv[1]).main(sys.argv[2:])
