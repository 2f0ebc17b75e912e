"""Writes a real DeepSpeed ZeRO-2 checkpoint on the CPU (DeepSpeed's CPU accelerator, gloo), then plants in copies
of it what DeepSpeed's universal loading (``"checkpoint": {"load_universal": true}``) reads, and resumes each copy
through cadence's check-and-load path (``Backend.load_optimizer_state`` and ``load_model_weights``) with a real
engine: prints one JSON line per case with the error raised and whether the payload ran (its marker file exists).

    python deepspeed_universal_worker.py ROOT
"""

import json
import os
import shutil
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

from cadence import TrainingArguments  # noqa: E402
from cadence.backend import Backend  # noqa: E402


class Payload:
    """Unpickled by plain pickle (as DeepSpeed's loaders do), it writes ``marker``: a crafted file's code running."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def plant(path, marker, genuine=None):
    """``path`` written as ``genuine`` (a file DeepSpeed wrote, read here with plain pickle: our own) plus a payload."""
    state = torch.load(genuine or path, map_location="cpu", weights_only=False) if (genuine or os.path.exists(path)) else {}
    state["payload"] = Payload(marker)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    torch.save(state, path)


def engine(seed, universal=False):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2}}
    if universal:
        config["checkpoint"] = {"load_universal": True}
    return deepspeed.initialize(model=model, optimizer=optimizer, config=config)[0]


def weights(e):
    return {k: v.detach().clone() for k, v in e.module.state_dict().items()}


def main():
    root = sys.argv[1]
    deepspeed.init_distributed(dist_backend="gloo")
    first = engine(0)
    for step in range(3):
        x = torch.randn(2, 4, generator=torch.Generator().manual_seed(step))
        first.backward(first(x).pow(2).sum())
        first.step()
    real = os.path.join(root, "real", "checkpoint-3")
    first.save_checkpoint(real)  # latest -> global_step3/{mp_rank_00_model_states.pt, zero_pp_rank_0_..._optim_states.pt}
    saved = weights(first)
    backend = Backend(TrainingArguments(os.path.join(root, "out"), use_cpu=True, report_to="none"))
    backend.deepspeed = {"zero_optimization": {"stage": 2}}  # what a DeepSpeed run's Backend holds

    # the genuine checkpoint resumes through cadence's check and the engine, weights exact
    backend.engine = engine(1)
    backend.load_optimizer_state(backend.engine.module, backend.engine.optimizer, real)
    print(json.dumps({"case": "genuine", "resumed_equal": all(torch.equal(saved[k], v)
                                                              for k, v in weights(backend.engine).items())}), flush=True)

    def case(name, plant_into):
        folder = os.path.join(root, name, "checkpoint-3")
        shutil.copytree(real, folder)
        marker = os.path.join(root, name, "ran.txt")
        plant_into(folder, marker)
        for load in ("load_optimizer_state", "load_model_weights"):
            backend.engine = universal  # refused before the engine reads anything, so one engine serves every case
            args = (backend.engine.module, backend.engine.optimizer) if load == "load_optimizer_state" else (backend.engine.module,)
            error = None
            try:
                getattr(backend, load)(*args, folder)
            except BaseException as e:  # noqa: BLE001 - what cadence (or, unchecked, DeepSpeed) raised
                error = f"{type(e).__name__}: {e}"
            print(json.dumps({"case": name, "load": load, "error": error, "ran": os.path.exists(marker)}), flush=True)
            if os.path.exists(marker):
                os.unlink(marker)

    universal = engine(1, universal=True)
    genuine_tag = lambda folder: os.path.join(folder, "global_step3")  # noqa: E731

    def universal_payload(folder, marker):  # latest_universal -> a tag whose model states carry a payload
        shutil.copytree(genuine_tag(folder), os.path.join(folder, "universal"))
        plant(os.path.join(folder, "universal", "mp_rank_00_model_states.pt"), marker)
        open(os.path.join(folder, "latest_universal"), "w").write("universal")

    def universal_dotdot(folder, marker):  # latest_universal -> ../elsewhere, outside the checkpoint
        elsewhere = os.path.join(os.path.dirname(folder), "elsewhere")
        shutil.copytree(genuine_tag(folder), elsewhere)
        plant(os.path.join(elsewhere, "mp_rank_00_model_states.pt"), marker)
        open(os.path.join(folder, "latest_universal"), "w").write("../elsewhere")

    def tag_link_out(folder, marker):  # the tag folder itself a symlink to an outside folder
        elsewhere = os.path.join(os.path.dirname(folder), "elsewhere")
        shutil.copytree(genuine_tag(folder), elsewhere)
        plant(os.path.join(elsewhere, "mp_rank_00_model_states.pt"), marker)
        os.symlink(elsewhere, os.path.join(folder, "universal"))
        open(os.path.join(folder, "latest_universal"), "w").write("universal")

    def zero_link_out(folder, marker):  # a genuine tag whose zero/ (the universal layout) links to an outside folder
        shutil.copytree(genuine_tag(folder), os.path.join(folder, "universal"))
        elsewhere = os.path.join(os.path.dirname(folder), "elsewhere")
        plant(os.path.join(elsewhere, "optimizer_state.pt"), marker)
        plant(os.path.join(elsewhere, "0.weight", "fp32.pt"), marker)
        os.symlink(elsewhere, os.path.join(folder, "universal", "zero"))
        open(os.path.join(folder, "latest_universal"), "w").write("universal")

    for name, planter in (("universal_payload", universal_payload), ("universal_dotdot", universal_dotdot),
                          ("tag_link_out", tag_link_out), ("zero_link_out", zero_link_out)):
        case(name, planter)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
