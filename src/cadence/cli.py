"""The ``cadence`` command."""

from __future__ import annotations

import argparse
import logging


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cadence", description="cadence: a PyTorch training loop with the Trainer API")
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small language model on text that ships with Python")
    demo.add_argument("--output-dir", default="cadence_output", help="where logs, checkpoints and the model go")
    demo.add_argument("--max-steps", type=int, default=300, help="optimizer steps (default 300, under a minute on 2 idle CPU cores)")
    demo.add_argument("--seed", type=int, default=42)
    demo.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --output-dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "demo":
        from .demo import run_demo

        run_demo(output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, resume=args.resume)
    return 0
