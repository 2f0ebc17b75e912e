"""The ``cadence`` command: ``demo``, ``train`` (``cli_train``), ``plot`` (``plot``), ``env`` (``cli_env``) and ``run``
(a script on cadence).

Every flag takes both spellings, ``--max-steps`` and ``--max_steps``, as ``cadence train`` (HfArgumentParser) does;
flags are never abbreviated. Nothing heavy is imported before the command needs it: ``--version`` and
``train --help`` answer without importing transformers.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


class _VersionAction(argparse.Action):
    """``--version``: cadence's version and the versions of the two libraries it runs on, read from their
    installed metadata (nothing imported)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from .cli_env import installed_version
        from .version import __version__

        others = ", ".join(f"{name} {installed_version(name) or 'not installed'}" for name in ("torch", "transformers"))
        print(f"cadence {__version__} ({others})")
        parser.exit()


def _flag(parser, name: str, **options) -> None:
    """``--name-with-hyphens`` and ``--name_with_underscores``, one option (the hyphen spelling shown first)."""
    words = name.lstrip("-")
    parser.add_argument(*dict.fromkeys([f"--{words.replace('_', '-')}", f"--{words.replace('-', '_')}"]), **options)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # allow_abbrev=False everywhere: a mistyped flag is an error, never taken for a longer one it starts
    parser = argparse.ArgumentParser(prog="cadence", description="cadence: a PyTorch training loop with the Trainer API",
                                     allow_abbrev=False)
    parser.add_argument("--version", action=_VersionAction, help="print the versions of cadence, torch and transformers")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small language model on text that ships with Python",
                               allow_abbrev=False)
    _flag(demo, "--output-dir", default="cadence_output", help="where logs, checkpoints and the model go")
    _flag(demo, "--max-steps", type=int, default=300,
          help="optimizer steps (default 300, under a minute on 2 idle CPU cores); it logs at least 5 times")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    # train's flags are every TrainingArguments field: HfArgumentParser reads them (cadence train --help)
    commands.add_parser("train", add_help=False, help="train a transformers model on local text files (--help for the flags)")
    plot = commands.add_parser("plot", help="draw a run's loss, learning rate, grad norm and eval metrics as one PNG",
                               allow_abbrev=False)
    plot.add_argument("run_dir", help="a run's output_dir (cadence's or transformers'), even while it trains")
    plot.add_argument("--out", default=None, help="the PNG to write (default: RUN_DIR/training_curves.png)")
    commands.add_parser("env", help="print the versions, devices and install facts a bug report needs",
                        allow_abbrev=False)
    # run's arguments are the script's: everything after `run` goes to it untouched
    commands.add_parser("run", add_help=False, help="run SCRIPT [ARGS...] or -m MODULE [ARGS...] with transformers' "
                                                     "Trainer names pointed at cadence's (TRL, sentence-transformers)")
    if argv[:1] == ["run"]:
        return run_patched(argv[1:])
    if argv[:1] == ["train"] and any(arg in ("-h", "--help") for arg in argv[1:]):
        from .cli_train import print_help  # the flags without importing transformers: a fast --help

        print_help()
        return 0
    args = parser.parse_args(argv[:1] if argv[:1] == ["train"] else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from .demo import run_demo

        run_demo(output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, resume=args.resume)
    elif args.command == "env":
        from .cli_env import environment_report

        print(environment_report())
    elif args.command == "train":
        from .cli_train import run_train

        try:
            run_train(argv[1:])
        except ValueError as error:  # bad files, columns or arguments: the message says which and how to fix it
            print(f"cadence train: error: {error}", file=sys.stderr)
            return 2
    elif args.command == "plot":
        if not Path(args.run_dir).exists():  # said before matplotlib and torch are imported
            print(f"cadence plot: error: {args.run_dir}: no such folder or file; pass a run's output_dir",
                  file=sys.stderr)
            return 2
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:  # an optional extra: say so before reading the run
            print("cadence plot: error: cadence plot needs matplotlib: pip install matplotlib (or pip install "
                  "'cadence[plot]')", file=sys.stderr)
            return 2
        from .plot import plot_run

        try:
            path = plot_run(args.run_dir, args.out)
        except (FileNotFoundError, ValueError, ImportError) as error:  # ImportError: no matplotlib, and how to get it
            print(f"cadence plot: error: {error}", file=sys.stderr)
            return 2
        print(f"cadence plot: {path}")
    return 0


_RUN_USAGE = "usage: cadence run SCRIPT [ARGS...]\n       cadence run -m MODULE [ARGS...]"
_RUN_HELP = f"""{_RUN_USAGE}

Run a Python script or module as `python SCRIPT ARGS` / `python -m MODULE ARGS` would, with transformers'
Trainer, TrainingArguments and callbacks pointed at cadence's first (cadence.patch_transformers()): libraries
built on transformers' Trainer (TRL, sentence-transformers) and scripts written for it then train on cadence,
unchanged. Everything after SCRIPT or MODULE goes to it untouched.

examples:
  cadence run train.py --output_dir out
  cadence run -m trl.scripts.sft --model_name_or_path ./tiny --dataset_name ./data --output_dir sft
  torchrun --nproc_per_node 2 -m cadence run train.py      # every process patched

options:
  -h, --help   show this help message and exit
  -m MODULE    run a module (a dotted name), as python -m does
"""


def _run_error(message: str) -> int:
    """argparse's shape for a usage error: the usage, then one line; exit status 2."""
    print(f"{_RUN_USAGE}\ncadence run: error: {message}", file=sys.stderr)
    return 2


def _missing_module(name: str) -> str | None:
    """Why ``python -m name`` could not start, found without importing anything (a library imported before the patch
    would keep transformers' classes); None when the module is there, or when the finders cannot tell without
    running code (runpy then says)."""
    import importlib.machinery
    import importlib.util

    parts = name.split(".")
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name is found without running it
        for depth in range(1, len(parts)):
            if spec is None or spec.submodule_search_locations is None:
                break
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: depth + 1]),
                                                            list(spec.submodule_search_locations))
    except (ImportError, ValueError):
        return None
    if spec is None or spec.name != name:
        return f"no module named {name!r} (python -m {name} would fail the same way): check the name and that its " \
               "package is installed in this Python"
    if spec.submodule_search_locations is not None:  # a package runs its __main__, as python -m does
        main = importlib.machinery.PathFinder.find_spec(f"{name}.__main__", list(spec.submodule_search_locations))
        if main is None:
            return f"{name!r} is a package without a __main__ module, so it cannot be run; name one of its modules"
    return None


def run_patched(argv: list[str]) -> int:
    """Run a script or module as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would, after
    ``cadence.patch_transformers()``: a library that subclasses transformers' Trainer (TRL, sentence-transformers)
    then trains on cadence, unmodified. Under ``torchrun -m cadence run ...`` every process does the same.
    The script or module is checked before the patch, so a wrong name is one line, not a traceback.

    ``patch_transformers()`` also sets ``CADENCE_PATCH_TRANSFORMERS=1``, so the Python processes the script starts
    (``trl sft`` re-launching itself through ``accelerate launch``, a script starting ``torchrun``) patch themselves
    through the installed start-up hook. SCRIPT may be a command on ``PATH`` written in Python
    (``cadence run accelerate launch --num_processes 2 train.py``, ``cadence run trl sft ...``).

    Args:
        argv: ``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]``; the script sees ``sys.argv`` as plain python sets it.

    Returns:
        0 when the script returns, 2 for a missing script or module; the script's own ``SystemExit`` passes through.

    Example:
        >>> run_patched(["-m", "trl.scripts.sft", "--model_name_or_path", "./tiny", "--output_dir", "out"])
    """
    import os
    import runpy
    import shutil

    if argv[:1] in (["-h"], ["--help"]):
        print(_RUN_HELP, end="")
        return 0
    if not argv:
        return _run_error("name a script to run, or -m MODULE")
    if argv[0] == "-m":
        if len(argv) < 2 or argv[1].startswith("-"):
            return _run_error("-m needs a module name, as in: cadence run -m trl.scripts.sft ...")
        sys.path.insert(0, os.getcwd())  # python -m puts the working folder first (also for finding the module)
        problem = _missing_module(argv[1])
        if problem:
            return _run_error(problem)
    elif argv[0].startswith("-"):
        return _run_error(f"unknown option {argv[0]!r}: options of the script go after its name (see cadence run --help)")
    else:
        if not os.path.exists(argv[0]) and os.sep not in argv[0]:  # a command: `cadence run accelerate launch ...`
            folders = os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])
            argv = [shutil.which(argv[0], path=folders) or argv[0], *argv[1:]]  # on PATH, or beside this Python
        if not os.path.exists(argv[0]):
            return _run_error(f"{argv[0]!r} does not exist (no such file in {os.getcwd()})")

    from .patch import PTH, hook_installed, patch_transformers

    patch_transformers()  # and marks the environment: Python children patch themselves at start-up
    if not hook_installed():
        print(f"cadence run: warning: {PTH} is not in this Python's site-packages (cadence runs from a source folder "
              "on PYTHONPATH?): Python processes this run starts (accelerate launch, trl's commands, torchrun) will "
              "train on transformers. Install cadence with pip (pip install -e .) to patch them too.", file=sys.stderr)
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module(alter_sys=True) puts the module's file in argv[0], as -m does
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # python SCRIPT puts the script's folder first
        runpy.run_path(script, run_name="__main__")
    return 0
