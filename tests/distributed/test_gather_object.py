"""Non-tensor outputs (one Python object per row) in evaluation and prediction (issue 19, item 7): concatenated
on one process, gathered from every process on several (torchrun, gloo), the padding rows dropped, in dataset
order; eval_use_gather_object=True gathers the tensors as objects too, with the same result."""

import os
import sys

import dist_exit
import pytest
import torch
from dist_exit import assert_finished

from cadence.evaluation import is_object_rows
from repo_paths import TESTS

HERE = TESTS


def launch(nproc, out):
    assert_finished(dist_exit.launch("gather_object_worker.py", out, nproc=nproc, timeout=240), nproc)
    return torch.load(out, weights_only=True)


def expected_words():
    from tiny import RegressionDataset

    return [f"x={v:.6f}" for v in RegressionDataset(19).x.tolist()]


def test_object_rows_are_told_from_structures():
    assert is_object_rows(["a", "b"]) and is_object_rows([{"id": 1}, {"id": 2}]) and is_object_rows([])
    assert not is_object_rows((torch.zeros(2), ["a", "b"])) and not is_object_rows([torch.zeros(1)])
    assert not is_object_rows("ab") and not is_object_rows(torch.zeros(2))


def test_one_process_concatenates_the_rows(tmp_path):
    sys.path.insert(0, HERE)
    from gather_object_worker import Words, metrics
    from tiny import RegressionDataset, make_args

    import cadence

    for flag in (False, True):
        args = make_args(tmp_path, per_device_eval_batch_size=3, eval_use_gather_object=flag)
        trainer = cadence.Trainer(Words(), args, compute_metrics=metrics)
        out = trainer.predict(RegressionDataset(19))
        assert out.predictions[1] == expected_words()
        assert out.metrics["test_rows"] == 19 and out.metrics["test_words_match"] == 1.0
        kept = make_args(tmp_path, per_device_eval_batch_size=3, eval_do_concat_batches=False)
        batches = cadence.Trainer(Words(), kept).predict(RegressionDataset(19)).predictions
        assert [w for _, words in batches for w in words] == expected_words() and len(batches) == 7


@pytest.mark.slow
def test_two_processes_gather_every_row_as_one(tmp_path):
    one = launch(1, str(tmp_path / "one.pt"))
    two = launch(2, str(tmp_path / "two.pt"))
    for flag in (False, True):
        assert one[flag]["words"] == two[flag]["words"] == expected_words(), flag  # dataset order, no padding row
        assert torch.equal(one[flag]["values"], two[flag]["values"]) and two[flag]["values"].shape == (19,)
        assert torch.equal(one[flag]["labels"], two[flag]["labels"])
        assert two[flag]["eval"]["eval_rows"] == 19 and two[flag]["eval"]["eval_words_match"] == 1.0
        assert two[flag]["eval"]["eval_loss"] == pytest.approx(one[flag]["eval"]["eval_loss"], rel=1e-12)
    assert torch.equal(two[True]["values"], two[False]["values"])  # tensors gathered as objects: the same rows
