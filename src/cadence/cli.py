"""The ``cadence`` command: ``demo``, ``train`` (``cli_train``), ``plot`` (``plot``) and ``run`` (a script on cadence)."""

from __future__ import annotations

import argparse
import logging
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(prog="cadence", description="cadence: a PyTorch training loop with the Trainer API")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small language model on text that ships with Python")
    demo.add_argument("--output-dir", default="cadence_output", help="where logs, checkpoints and the model go")
    demo.add_argument("--max-steps", type=int, default=300, help="optimizer steps (default 300, under a minute on 2 idle CPU cores)")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    # train's flags are every TrainingArguments field: HfArgumentParser reads them (cadence train --help)
    commands.add_parser("train", add_help=False, help="train a transformers model on local text files (--help for the flags)")
    plot = commands.add_parser("plot", help="draw a run's loss, learning rate, grad norm and eval metrics as one PNG")
    plot.add_argument("run_dir", help="a run's output_dir (cadence's or transformers'), even while it trains")
    plot.add_argument("--out", default=None, help="the PNG to write (default: RUN_DIR/training_curves.png)")
    # run's arguments are the script's: everything after `run` goes to it untouched
    commands.add_parser("run", add_help=False, help="run SCRIPT [ARGS...] or -m MODULE [ARGS...] with transformers' "
                                                     "Trainer names pointed at cadence's (TRL, sentence-transformers)")
    if argv[:1] == ["run"]:
        return run_patched(argv[1:])
    args = parser.parse_args(argv[:1] if argv[:1] == ["train"] else argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from .demo import run_demo

        run_demo(output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, resume=args.resume)
    elif args.command == "train":
        from .cli_train import run_train

        try:
            run_train(argv[1:])
        except ValueError as error:  # bad files, columns or arguments: the message says which and how to fix it
            print(f"cadence train: error: {error}", file=sys.stderr)
            return 2
    elif args.command == "plot":
        from .plot import plot_run

        try:
            path = plot_run(args.run_dir, args.out)
        except (FileNotFoundError, ValueError) as error:
            print(f"cadence plot: error: {error}", file=sys.stderr)
            return 2
        print(f"cadence plot: {path}")
    return 0


_RUN_USAGE = "usage: cadence run SCRIPT [ARGS...] | cadence run -m MODULE [ARGS...]"


def run_patched(argv: list[str]) -> int:
    """Run a script or module as ``python SCRIPT ARGS`` / ``python -m MODULE ARGS`` would, after
    ``cadence.patch_transformers()``: a library that subclasses transformers' Trainer (TRL, sentence-transformers)
    then trains on cadence, unmodified. Under ``torchrun -m cadence run ...`` every process does the same.

    Args:
        argv: ``[SCRIPT, *ARGS]`` or ``["-m", MODULE, *ARGS]``; the script sees ``sys.argv`` as plain python sets it.

    Returns:
        0 when the script returns; its own ``SystemExit`` passes through.

    Example:
        >>> run_patched(["-m", "trl.scripts.sft", "--model_name_or_path", "./tiny", "--output_dir", "out"])
    """
    import os
    import runpy

    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(_RUN_USAGE, file=sys.stderr if not argv or argv[0] == "-m" else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    from .patch import patch_transformers

    patch_transformers()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module(alter_sys=True) puts the module's file in argv[0], as -m does
        sys.path.insert(0, os.getcwd())  # python -m puts the working folder first
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        script = argv[0]
        if not os.path.exists(script):
            print(f"cadence run: error: {script!r} does not exist. {_RUN_USAGE}", file=sys.stderr)
            return 2
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # python SCRIPT puts the script's folder first
        runpy.run_path(script, run_name="__main__")
    return 0
