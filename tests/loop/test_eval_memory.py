"""Evaluation memory stays bounded: flat in the eval-set size with batch_eval_metrics, k steps with eval_accumulation_steps.

What is measured, during ``trainer.evaluate()`` on a model whose output is 16 KiB per row:
- host: the peak of ``tracemalloc`` (every Python and numpy allocation);
- device proxy: the peak of the bytes held by live torch tensor storages created inside evaluation
  (a ``TorchDispatchMode`` records each op's output storages and drops them once freed). This
  machine has no GPU, so this stands in for ``torch.cuda.max_memory_allocated``.
"""

import tracemalloc

import pytest
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cadence import Trainer, TrainingArguments, evaluation

ROW = (16, 256)  # float32 logits per row: 16 KiB


class BigOutput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, ROW[0] * ROW[1])

    def forward(self, x, labels=None):
        logits = self.lin(x).view(-1, *ROW)
        loss = torch.nn.functional.cross_entropy(logits[:, 0], labels)
        return {"loss": loss, "logits": logits}


class Rows(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(n, 4, generator=g), torch.randint(0, ROW[1], (n,), generator=g)
        # one tensor per row: indexing runs no torch op, so the dataset's storage is not counted as evaluation's
        self.x, self.y = [r.clone() for r in x], [v.clone() for v in y]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of live tensor storages produced by torch ops while active."""

    def __init__(self):
        super().__init__()
        self.refs, self.peak = {}, 0

    def _live(self) -> int:
        for key in [k for k, (ref, _) in self.refs.items() if ref.expired()]:
            del self.refs[key]
        return sum(n for _, n in self.refs.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._live()  # drop freed storages first, so a reused address counts again
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                ref = StorageWeakRef(storage)
                self.refs.setdefault(ref.cdata, (ref, storage.nbytes()))
        self.peak = max(self.peak, self._live())
        return out


class Top1:
    """Per-batch metric: keeps two integers, never the predictions."""

    def __init__(self):
        self.hits = self.total = 0

    def __call__(self, p, compute_result):
        self.hits += int((p.predictions[:, 0].argmax(-1) == p.label_ids).sum())
        self.total += len(p.label_ids)
        return {"top1": self.hits / self.total} if compute_result else {}


def measure(out_dir, n, **kw):
    args = TrainingArguments(output_dir=out_dir, report_to="none", disable_tqdm=True, per_device_eval_batch_size=100, **kw)
    trainer = Trainer(BigOutput(), args, compute_metrics=Top1() if kw.get("batch_eval_metrics") else lambda p: {"n": 1})
    ds = Rows(n)
    with LiveTensorBytes():  # warm-up: first-call imports and caches are not the evaluation's memory
        trainer.evaluate(Rows(100))
    tracemalloc.start()
    with LiveTensorBytes() as live:
        metrics = trainer.evaluate(ds)
    host_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return host_peak, live.peak, metrics


def test_batch_eval_metrics_memory_is_flat_in_eval_set_size(out_dir):
    batch_bytes = 100 * ROW[0] * ROW[1] * 4  # one batch of logits: 1.6 MB
    host_small, live_small, _ = measure(out_dir, 1_000, batch_eval_metrics=True)
    host_big, live_big, metrics = measure(out_dir, 10_000, batch_eval_metrics=True)
    assert 0 <= metrics["eval_top1"] <= 1 and "eval_loss" in metrics
    # 10x the examples: the same peaks (a few batches' worth of tensors, ~no host memory)
    assert live_big <= live_small + batch_bytes // 10, (live_small, live_big)
    assert live_big < 4 * batch_bytes
    # host: ~0.1 MiB either way (allocator noise of tens of KiB); keeping the logits would be 156 MiB
    assert host_big <= host_small + 256 * 1024, (host_small, host_big)
    print(f"\nbatch_eval_metrics: 1k rows -> tensors {live_small / 2**20:.1f} MiB, host {host_small / 2**20:.2f} MiB; "
          f"10k rows -> tensors {live_big / 2**20:.1f} MiB, host {host_big / 2**20:.2f} MiB")


def test_accumulating_predictions_grows_so_the_measure_can_fail(out_dir):
    _, live_small, _ = measure(out_dir, 300)
    _, live_big, _ = measure(out_dir, 1_200)
    extra_predictions = 900 * ROW[0] * ROW[1] * 4  # the 900 more rows of logits that are kept
    # the predictions are kept: memory follows the eval-set size ...
    assert live_big - live_small >= 0.95 * extra_predictions, (live_small, live_big)
    # ... once: written into one buffer, not held as per-batch pieces plus their concatenation (2x)
    assert live_big - live_small <= 1.2 * extra_predictions, (live_small, live_big)


@pytest.mark.parametrize("k", [None, 1, 3])
def test_at_most_k_steps_of_predictions_on_the_device(out_dir, monkeypatch, k):
    made = []

    class Recording(evaluation.Collector):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            made.append(self)

    monkeypatch.setattr(evaluation, "Collector", Recording)
    args = TrainingArguments(output_dir=out_dir, report_to="none", disable_tqdm=True, per_device_eval_batch_size=10,
                             eval_accumulation_steps=k)
    out = Trainer(BigOutput(), args).predict(Rows(75))  # 8 steps
    assert out.predictions.shape == (75, *ROW)
    assert made[0].max_device_steps == (k or 1)
