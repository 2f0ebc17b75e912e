"""A training script as written for transformers, with no cadence in it: ``import transformers`` and a subclass of
``transformers.Trainer``. Whether it trains on cadence depends only on how it is launched (``cadence run``, or a
parent that did, through the start-up hook); it records what it was built on.

    python tests/workers/patch_child_worker.py OUT_DIR            (or under torchrun / accelerate launch: every rank)
    python tests/workers/patch_child_worker.py OUT_DIR --torchrun N   (this process starts ``torchrun`` with N workers itself)

Each rank writes ``OUT_DIR/rank{R}.json``: its trainer class's MRO and the environment's mark; rank 0 writes
``OUT_DIR/result.pt`` (the logged losses and the final weights). float64: two layouts compare to 1e-5 and closer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
__import__("repo_paths").put_on_path()  # and its folders: test modules too
import tiny  # noqa: E402


class MyTrainer(transformers.Trainer):  # defined after `import transformers`, as scripts and libraries do
    pass


class Data(tiny.RegressionDataset):
    def __getitem__(self, i):
        return {k: v.double() for k, v in super().__getitem__(i).items()}


def main() -> None:
    out = sys.argv[1]
    if sys.argv[2:3] == ["--torchrun"]:  # a script that starts its own torchrun
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc_per_node={sys.argv[3]}", os.path.abspath(__file__), out])
        sys.exit(proc.returncode)
    args = transformers.TrainingArguments(out, max_steps=4, per_device_train_batch_size=4, learning_rate=0.1,
                                          logging_steps=1, report_to=[], save_strategy="steps", save_steps=4,
                                          use_cpu=True, disable_tqdm=True, seed=7, lr_scheduler_type="linear")
    trainer = MyTrainer(tiny.RegressionModel().double(), args, train_dataset=Data(32))
    trainer.train()
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"mro": [f"{c.__module__}.{c.__qualname__}" for c in type(trainer).__mro__],
                   "mark": os.environ.get("CADENCE_PATCH_TRANSFORMERS"), "world": int(os.environ.get("WORLD_SIZE", "1")),
                   "executable": sys.executable}, f)
    if rank == 0:
        losses = [(h["step"], k, float(v)) for h in trainer.state.log_history for k, v in h.items()
                  if isinstance(v, float) and k != "step" and not k.endswith(("runtime", "per_second"))]
        torch.save({"losses": losses, "weights": {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}},
                   os.path.join(out, "result.pt"))


if __name__ == "__main__":
    main()
