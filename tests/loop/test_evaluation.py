"""evaluate() / predict() against transformers.Trainer, and the evaluation options."""

import numpy as np
import pytest
import torch
from tiny import (ClassDataset, Classifier, LMDataset, RegressionDataset, RegressionModel, TokenDataset, TokenTagger,
                  Stream, lm_collate, make_args, pad_collate, tiny_gpt2)

from cadence import Trainer


def accuracy(eval_pred):
    predictions, labels = eval_pred
    return {"accuracy": float((predictions.argmax(-1) == labels).mean())}


def hf_trainer(out_dir, model, collator=None, **kw):
    transformers = pytest.importorskip("transformers")
    args = transformers.TrainingArguments(output_dir=out_dir + "_hf", report_to="none", use_cpu=True,
                                          disable_tqdm=True, **kw)
    return transformers.Trainer(model, args, data_collator=collator, compute_metrics=accuracy)


def test_classification_matches_transformers(out_dir):
    ds = ClassDataset(11)  # batches of 4: the last is short
    ours = Trainer(Classifier(), make_args(out_dir, per_device_eval_batch_size=4), compute_metrics=accuracy)
    theirs = hf_trainer(out_dir, Classifier(), per_device_eval_batch_size=4)
    a, b = ours.predict(ds), theirs.predict(ds)
    # the same float32 forward on the same batches: equal here; a tolerance of a few float32 ulps in case a
    # library changes how it calls the model (the order of rows and fields is checked exactly)
    np.testing.assert_allclose(a.predictions, b.predictions, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(a.label_ids, b.label_ids)
    assert a.metrics["test_accuracy"] == b.metrics["test_accuracy"]
    assert a.metrics["test_loss"] == pytest.approx(b.metrics["test_loss"], rel=1e-6)  # one item per row: equal
    m, n = ours.evaluate(ds), theirs.evaluate(ds)
    assert m["eval_accuracy"] == n["eval_accuracy"] and m["eval_loss"] == pytest.approx(n["eval_loss"], rel=1e-6)


def item_mean_lm_loss(model, ds):
    """Sum of per-token losses over every row (each run alone, unpadded) / number of counted tokens."""
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(len(ds)):
            ids, labels = ds[i]["input_ids"][None], ds[i]["labels"][None]
            logits = model(input_ids=ids).logits[:, :-1].double()
            target = labels[:, 1:]
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum").item()
            count += int((target != -100).sum())
    return total / count


def test_causal_lm_matches_transformers_and_loss_is_the_item_mean(out_dir):
    ds = LMDataset(14)
    ours = Trainer(tiny_gpt2(), make_args(out_dir, per_device_eval_batch_size=4), data_collator=lm_collate,
                   compute_metrics=accuracy)
    theirs = hf_trainer(out_dir, tiny_gpt2(), lm_collate, per_device_eval_batch_size=4)
    a, b = ours.predict(ds), theirs.predict(ds)
    assert a.predictions.shape == b.predictions.shape == (14, 16, 64)  # padded across batches with -100
    np.testing.assert_allclose(a.predictions, b.predictions, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(a.label_ids, b.label_ids)
    assert a.metrics["test_accuracy"] == b.metrics["test_accuracy"]
    expected = item_mean_lm_loss(ours.model, ds)
    assert a.metrics["test_loss"] == pytest.approx(expected, rel=1e-5)
    # transformers averages per-batch means weighted by rows: not the mean over tokens
    assert abs(b.metrics["test_loss"] - expected) > 1e-3
    for batch in (1, 3, 8):
        ours.args.per_device_eval_batch_size = batch
        assert ours.evaluate(ds)["eval_loss"] == pytest.approx(expected, rel=1e-5)


def test_include_for_metrics_passes_inputs_and_row_losses(out_dir):
    seen = []

    def metrics(p):
        seen.append(p)
        return {"n": len(p.inputs)}

    ds = ClassDataset(7)
    model = Classifier()
    model.main_input_name = "x"  # what transformers models name their main input
    trainer = Trainer(model, make_args(out_dir, per_device_eval_batch_size=3, include_for_metrics=["inputs", "loss"]),
                      compute_metrics=metrics)
    out = trainer.evaluate(ds)
    (p,) = seen
    np.testing.assert_array_equal(p.inputs, ds.x.numpy())
    assert p.losses.shape == (7,)
    with torch.no_grad():
        batch_losses = [torch.nn.functional.cross_entropy(trainer.model.lin(ds.x[i:i + 3]), ds.y[i:i + 3]).item()
                        for i in (0, 3, 6)]
    np.testing.assert_allclose(p.losses, np.repeat(batch_losses, [3, 3, 1]), rtol=1e-6)
    assert out["eval_n"] == 7 and len(list(p)) == 4


def test_preprocess_logits_for_metrics_and_label_shapes(out_dir):
    def argmax(logits, labels):
        assert labels.shape == logits.shape[:1]
        return logits.argmax(-1)

    trainer = Trainer(Classifier(), make_args(out_dir, per_device_eval_batch_size=4),
                      compute_metrics=lambda p: {"acc": float((p.predictions == p.label_ids).mean())},
                      preprocess_logits_for_metrics=argmax)
    ds = ClassDataset(9)
    out = trainer.predict(ds)
    with torch.no_grad():
        expected = trainer.model.lin(ds.x).argmax(-1).numpy()
    np.testing.assert_array_equal(out.predictions, expected)
    assert out.metrics["test_acc"] == float((expected == ds.y.numpy()).mean())


def test_prediction_loss_only(out_dir):
    trainer = Trainer(Classifier(), make_args(out_dir, prediction_loss_only=True), compute_metrics=accuracy)
    out = trainer.predict(ClassDataset(5))
    assert out.predictions is None and out.label_ids is None and "test_accuracy" not in out.metrics
    assert "test_loss" in out.metrics
    # without compute_metrics, evaluate() gathers nothing but predict() still returns predictions
    trainer = Trainer(Classifier(), make_args(out_dir))
    assert trainer.predict(ClassDataset(5)).predictions.shape == (5, 3)


class Multi(torch.nn.Module):
    """Returns nested outputs: a dict with a tuple of tensors and an extra key to ignore."""

    def __init__(self, ignore=None):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        if ignore is not None:
            self.config = type("Config", (), {"keys_to_ignore_at_inference": ignore})()

    def forward(self, x, labels=None):
        logits = self.lin(x)
        out = {"logits": logits, "pair": (logits * 2, logits.sum(-1)), "hidden": x}
        if labels is not None:
            out = {"loss": torch.nn.functional.cross_entropy(logits, labels), **out}
        return out


def test_ignore_keys_config_keys_and_nested_outputs(out_dir):
    ds = ClassDataset(5)
    trainer = Trainer(Multi(ignore=["hidden"]), make_args(out_dir, per_device_eval_batch_size=2))
    preds = trainer.predict(ds).predictions
    assert len(preds) == 2  # logits, (pair0, pair1); "hidden" left out by the config
    logits, (twice, total) = preds
    np.testing.assert_allclose(twice, 2 * logits, rtol=1e-6)
    assert total.shape == (5,)
    preds = trainer.predict(ds, ignore_keys=["pair"]).predictions  # explicit keys replace the config's
    assert len(preds) == 2 and preds[1].shape == (5, 4)


class TwoLabels(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)

    def forward(self, x, target=None, weight=None):
        logits = self.lin(x)
        return (torch.nn.functional.cross_entropy(logits, target), logits)


class TwoLabelDataset(ClassDataset):
    def __getitem__(self, i):
        return {"x": self.x[i], "target": self.y[i], "weight": torch.tensor(float(i))}


def test_label_names_and_tuple_outputs(out_dir):
    ds = TwoLabelDataset(6)
    trainer = Trainer(TwoLabels(), make_args(out_dir, label_names=["target", "weight"], per_device_eval_batch_size=4))
    out = trainer.predict(ds)
    target, weight = out.label_ids
    np.testing.assert_array_equal(target, ds.y.numpy())
    np.testing.assert_array_equal(weight, np.arange(6, dtype=np.float32))
    assert out.predictions.shape == (6, 3) and "test_loss" in out.metrics


def test_eval_do_concat_batches_false_keeps_batches(out_dir):
    ds = TokenDataset(7)
    trainer = Trainer(TokenTagger(), make_args(out_dir, per_device_eval_batch_size=3, eval_do_concat_batches=False),
                      data_collator=pad_collate)
    out = trainer.predict(ds)
    assert [p.shape[0] for p in out.predictions] == [3, 3, 1] and len(out.label_ids) == 3
    widths = [max(len(ds[i]["input_ids"]) for i in range(s, min(s + 3, 7))) for s in (0, 3, 6)]
    assert [lab.shape[1] for lab in out.label_ids] == widths  # no padding across batches


class BatchMetrics:
    """compute_metrics for batch_eval_metrics: accumulates a token accuracy and reports it at the end."""

    def __init__(self):
        self.calls, self.correct, self.total = [], 0, 0

    def __call__(self, p, compute_result):
        self.calls.append(compute_result)
        assert torch.is_tensor(p.predictions)
        keep = p.label_ids != -100
        self.correct += int((p.predictions.argmax(-1)[keep] == p.label_ids[keep]).sum())
        self.total += int(keep.sum())
        if compute_result:
            return {"accuracy": self.correct / self.total}
        return {}


@pytest.mark.parametrize("method, prefix", [("evaluate", "eval"), ("predict", "test")])
def test_batch_eval_metrics_per_batch_equals_accumulated(out_dir, method, prefix):
    """evaluate() and predict() call compute_metrics per batch (compute_result on the last) and get the metrics
    of one call over all batches; predict() still returns every prediction."""
    ds = TokenDataset(10)

    def run(trainer):  # the metrics, and predict()'s whole output
        out = getattr(trainer, method)(ds)
        return (out, None) if method == "evaluate" else (out.metrics, out)

    metric = BatchMetrics()
    per_batch, out = run(Trainer(TokenTagger(), make_args(out_dir, per_device_eval_batch_size=4, batch_eval_metrics=True),
                                 data_collator=pad_collate, compute_metrics=metric))
    assert metric.calls == [False, False, True]

    def whole(p):
        keep = p.label_ids != -100
        return {"accuracy": float((p.predictions.argmax(-1)[keep] == p.label_ids[keep]).mean())}

    accumulated, _ = run(Trainer(TokenTagger(), make_args(out_dir, per_device_eval_batch_size=4),
                                 data_collator=pad_collate, compute_metrics=whole))
    assert per_batch[f"{prefix}_accuracy"] == pytest.approx(accumulated[f"{prefix}_accuracy"], rel=1e-12)
    assert per_batch[f"{prefix}_loss"] == pytest.approx(accumulated[f"{prefix}_loss"], rel=1e-12)
    if out is not None:
        assert out.predictions.shape[0] == 10 and out.label_ids.shape[0] == 10


def test_compute_metrics_error_names_itself(out_dir):
    def my_metric(p):
        raise ZeroDivisionError("nope")

    trainer = Trainer(Classifier(), make_args(out_dir), compute_metrics=my_metric)
    with pytest.raises(RuntimeError, match=r"compute_metrics \(my_metric\) raised ZeroDivisionError: nope"):
        trainer.evaluate(ClassDataset(4))


def test_an_empty_eval_or_test_set_is_evaluated_as_in_transformers(out_dir):
    trainer = Trainer(RegressionModel(), make_args(out_dir), eval_dataset=RegressionDataset(0))  # accepted
    assert "eval_loss" not in trainer.evaluate()  # no batch, no loss; compared with transformers in test_hf_allows.py
    output = trainer.predict(RegressionDataset(0))
    assert (output.predictions, output.label_ids, output.metrics["test_samples_per_second"]) == (None, None, 0.0)


def test_gpt2_style_lm_head_shifts_labels():
    from cadence.data import loss_shifts_labels

    model = tiny_gpt2()
    assert getattr(model, "loss_type", None) is None  # transformers gives GPT2LMHeadModel no loss type
    assert loss_shifts_labels(model) is True and loss_shifts_labels(Classifier()) is False


def test_eval_batch_sampler_gives_whole_batches_in_dataset_order():
    from cadence.data import EvalBatchSampler

    ranks = [EvalBatchSampler(11, 3, rank=r, world_size=2) for r in range(2)]
    assert [list(s) for s in ranks] == [[[0, 1, 2], [6, 7, 8]], [[3, 4, 5], [9, 10]]]
    ranks = [EvalBatchSampler(7, 3, rank=r, world_size=2) for r in range(2)]  # 3 batches on 2 processes
    assert [list(s) for s in ranks] == [[[0, 1, 2], [6]], [[3, 4, 5], [0, 1, 2]]]
    assert [ranks[1].is_padding(k) for k in range(2)] == [False, True] and not ranks[0].is_padding(1)
    gathered = [i for k in range(2) for s in ranks if not s.is_padding(k) for i in list(s)[k]]
    assert gathered == list(range(7))
    assert list(EvalBatchSampler(7, 3, drop_last=True)) == [[0, 1, 2], [3, 4, 5]]


def test_iterable_eval_on_several_processes_is_refused(tmp_path, monkeypatch):
    """Its padded last batch could not be told from real rows: a clear error instead of double-counted metrics."""
    from cadence import TrainingArguments

    trainer = Trainer(RegressionModel(), TrainingArguments(str(tmp_path), disable_tqdm=True))
    assert "eval_loss" in trainer.evaluate(Stream(RegressionDataset(8)))  # one process: fine
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 2))
    with pytest.raises(ValueError, match="iterable dataset with 2 processes is not supported"):
        trainer.evaluate(Stream(RegressionDataset(8)))
