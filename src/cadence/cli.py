"""The ``cadence`` command: ``demo``, ``train`` (``cli_train``) and ``plot`` (``plot``)."""

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
