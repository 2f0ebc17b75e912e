"""Writes a real DeepSpeed ZeRO checkpoint on the CPU (DeepSpeed's CPU accelerator, gloo, a torch AdamW), then
resumes it in a second engine through cadence's check: prints one JSON line with the files written, the
files the check passed, and whether the resumed engine holds the saved weights and Adam moments exactly.

    python deepspeed_cpu_worker.py STAGE FOLDER [--check-only]
"""

import json
import os
import socket
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
with socket.socket() as s:  # a free port for this process's own group of one
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                    ("MASTER_PORT", str(port))):
    os.environ.setdefault(name, value)

import torch  # noqa: E402
import deepspeed  # noqa: E402

from cadence.checkpoint_io.deepspeed_files import check_deepspeed_folder  # noqa: E402


def engine(stage, seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage}}
    return deepspeed.initialize(model=model, optimizer=optimizer, config=config)[0]


def state(e):
    weights = {k: v.detach().clone() for k, v in e.module.state_dict().items()}
    moments = [s["exp_avg"].clone() for s in e.optimizer.optimizer.state.values() if "exp_avg" in s]
    return weights, moments


def main():
    stage, folder = int(sys.argv[1]), sys.argv[2]
    deepspeed.init_distributed(dist_backend="gloo")
    first = engine(stage, 0)
    for step in range(3):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        first.backward(first(x).pow(2).sum())
        first.step()
    first.save_checkpoint(folder)
    saved = state(first)
    written = sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)
    checked = [os.path.relpath(p, folder) for p in check_deepspeed_folder(folder)]
    second = engine(stage, 1)  # other initial weights: the load must replace them
    before = state(second)
    second.load_checkpoint(folder)
    after = state(second)
    same = lambda a, b: (all(torch.equal(a[0][k], b[0][k]) for k in a[0])  # noqa: E731
                         and len(a[1]) == len(b[1]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1])))
    print(json.dumps({"written": written, "checked": checked, "moments": len(saved[1]),
                      "resumed_equal": same(after, saved), "differed_before": not same(before, saved)}), flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
