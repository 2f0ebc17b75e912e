"""The order in which training sees the samples, epoch after epoch, is transformers' order for the same
seed: recorded in the model's forward (what the loop really trains on), over three epochs. A bug that
hits every cadence run alike (an epoch sampler seeded without the epoch, say) passes every
cadence-vs-cadence test (resume, accumulation, processes) and fails here."""

import pytest
import torch

import cadence

transformers = pytest.importorskip("transformers")


class Indexed(torch.utils.data.Dataset):
    def __init__(self, length):
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return {"idx": torch.tensor(i), "labels": torch.tensor(float(i))}


class Recorder(torch.nn.Module):
    """Records the sample indices of every micro-batch it is given."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.seen = []

    def forward(self, idx, labels=None):
        self.seen.append(idx.tolist())
        return ((self.w - labels).pow(2).mean(),)


def seen_order(lib, out_dir, length, **kw):
    model = Recorder()
    args = lib.TrainingArguments(output_dir=out_dir, num_train_epochs=3, save_strategy="no", report_to="none",
                                 disable_tqdm=True, use_cpu=True, **kw)
    lib.Trainer(model, args, train_dataset=Indexed(length)).train()
    return model.seen


CASES = {
    "batch4": dict(per_device_train_batch_size=4, seed=11),
    "batch3_ga2": dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, seed=5),
    "drop_last": dict(per_device_train_batch_size=4, dataloader_drop_last=True, seed=11),
}


@pytest.mark.parametrize("case", CASES)
def test_training_order_equals_transformers_over_three_epochs(case, tmp_path):
    kw, length = CASES[case], 10
    ours = seen_order(cadence, str(tmp_path / "c"), length, **kw)
    theirs = seen_order(transformers, str(tmp_path / "h"), length, **kw)
    assert ours == theirs
    batch, drop = kw["per_device_train_batch_size"], kw.get("dataloader_drop_last", False)
    per_epoch = length // batch if drop else -(-length // batch)
    assert len(ours) == 3 * per_epoch
    epochs = [sum(ours[e * per_epoch:(e + 1) * per_epoch], []) for e in range(3)]
    if not drop:
        assert all(sorted(e) == list(range(length)) for e in epochs)  # each epoch is a permutation of the set
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch


def test_training_order_is_pinned(tmp_path):
    """The order for seed 11 written out, so that a change on both sides (cadence and transformers) shows."""
    ours = seen_order(cadence, str(tmp_path), 10, per_device_train_batch_size=4, seed=11)
    assert ours == [[1, 7, 2, 0], [9, 3, 5, 6], [4, 8],
                    [3, 5, 8, 1], [0, 6, 9, 2], [7, 4],
                    [8, 5, 4, 6], [2, 3, 1, 9], [0, 7]]  # fmt: skip
