"""Best model tracking, save_strategy="best", load_best_model_at_end, early stopping, eval_dataset dicts."""

import os

import pytest
import torch
from safetensors.torch import load_file
from tiny import RegressionDataset, RegressionModel, args_with

import cadence
from cadence import EarlyStoppingCallback, Trainer


make_args = args_with(learning_rate=0.05, per_device_train_batch_size=4, eval_strategy="steps", eval_steps=1)


def scripted(values):
    """compute_metrics returning the given scores, one per evaluation."""
    scores = iter(values)
    return lambda p: {"score": next(scores)}


def checkpoints(out_dir):
    return sorted((n for n in os.listdir(out_dir) if n.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1]))


def weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def test_eval_dataset_dict_prefixes_and_best_metric_names_one(out_dir):
    evals = {"near": RegressionDataset(8, seed=1), "far": RegressionDataset(12, seed=2)}
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=4, metric_for_best_model="far_loss"),
                      train_dataset=RegressionDataset(32), eval_dataset=evals)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "eval_far_loss" in h]
    near = [h for h in trainer.state.log_history if "eval_near_loss" in h]  # each set is logged on its own
    assert len(logs) == len(near) == 4 and all("eval_near_runtime" in h for h in near)
    best = min(logs, key=lambda h: h["eval_far_loss"])
    assert trainer.state.best_metric == best["eval_far_loss"]
    # as in transformers, the best step and checkpoint are tracked only when checkpoints are saved
    assert trainer.state.best_global_step is None and trainer.state.best_model_checkpoint is None
    direct = trainer.evaluate(evals["far"], metric_key_prefix="eval_far")
    assert direct["eval_far_loss"] == pytest.approx(trainer.evaluate()["eval_far_loss"], rel=1e-12)


@pytest.mark.parametrize("name", ["loss", "eval_loss"])
def test_metric_with_or_without_prefix_and_lower_is_better_for_loss(out_dir, name):
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=3, metric_for_best_model=name),
                      train_dataset=RegressionDataset(32), eval_dataset=RegressionDataset(8))
    trainer.train()
    losses = [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h]
    assert trainer.args.greater_is_better is False and trainer.state.best_metric == min(losses)


def test_save_strategy_best_saves_only_on_improvement(out_dir):
    trainer = Trainer(RegressionModel(), make_args(out_dir, max_steps=5, save_strategy="best", metric_for_best_model="score"),
                      train_dataset=RegressionDataset(32), eval_dataset=RegressionDataset(4),
                      compute_metrics=scripted([3.0, 1.0, 2.0, 5.0, 4.0]))
    trainer.train()
    assert checkpoints(out_dir) == ["checkpoint-1", "checkpoint-4"]
    state = trainer.state
    assert (state.best_metric, state.best_global_step) == (5.0, 4)
    assert state.best_model_checkpoint == os.path.join(out_dir, "checkpoint-4")


def test_load_best_model_at_end_restores_the_best_checkpoint(out_dir):
    args = make_args(out_dir, max_steps=4, save_strategy="steps", save_steps=1, load_best_model_at_end=True,
                     metric_for_best_model="score", save_total_limit=1)
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32), eval_dataset=RegressionDataset(4),
                      compute_metrics=scripted([1.0, 5.0, 2.0, 3.0]))
    last = {}

    class KeepLast(cadence.TrainerCallback):  # the newest checkpoint's weights, before the end leaves the best only
        def on_save(self, args, state, control, **kwargs):
            last.update(weights(os.path.join(args.output_dir, f"checkpoint-{state.global_step}")))

    trainer.add_callback(KeepLast())
    trainer.train()
    assert checkpoints(out_dir) == ["checkpoint-2"]  # save_total_limit=1: the best only, once training ends
    best = weights(os.path.join(out_dir, "checkpoint-2"))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, best[name]), name
        assert not torch.equal(value, last[name]), name  # training moved on after the best step


@pytest.mark.parametrize("lib", ["cadence", "transformers"])
def test_early_stopping_stops_at_the_right_step_and_restores_the_best(out_dir, lib):
    module = pytest.importorskip(lib)
    args = module.TrainingArguments(
        output_dir=out_dir, disable_tqdm=True, report_to="none", learning_rate=0.05, per_device_train_batch_size=4,
        eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=1, max_steps=10, use_cpu=True,
        load_best_model_at_end=True, metric_for_best_model="score")
    # improvements at evaluations 1 and 2; 3 ties, 4 is worse: patience 2 runs out at step 4
    trainer = module.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32),
                             eval_dataset=RegressionDataset(4), compute_metrics=scripted([1.0, 2.0, 2.0, 1.5, 9.0]),
                             callbacks=[module.EarlyStoppingCallback(early_stopping_patience=2)])
    trainer.train()
    state = trainer.state
    assert state.global_step == 4
    assert (state.best_metric, state.best_global_step) == (2.0, 2)
    assert state.best_model_checkpoint == os.path.join(out_dir, "checkpoint-2")
    best = weights(os.path.join(out_dir, "checkpoint-2"))
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, best[name]), name


def test_missing_metric_for_best_model_names_the_existing_keys(out_dir):
    args = make_args(out_dir, max_steps=3, metric_for_best_model="accuracy")
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32), eval_dataset=RegressionDataset(8))
    with pytest.raises(KeyError, match=r"metric_for_best_model='accuracy'.*'eval_accuracy'.*eval_loss"):
        trainer.train()  # at the first evaluation, as transformers (a subclass's evaluate may add the metric)
    assert trainer.state.global_step == 1
    trainer = Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32), eval_dataset=RegressionDataset(8),
                      compute_metrics=lambda p: {"f1": 0.5})  # a compute_metrics that does not return it
    with pytest.raises(KeyError, match=r"metric_for_best_model='accuracy'.*'eval_accuracy'.*eval_f1"):
        trainer.train()
    assert trainer.state.global_step == 1  # at the first evaluation


def test_load_model_weights_refuses_a_mismatch(tmp_path):
    from cadence.checkpoint_io.formats import load_model_weights, save_model_weights

    save_model_weights(RegressionModel(a=1.0), tmp_path)
    model = RegressionModel()
    load_model_weights(model, tmp_path)
    assert model.a.item() == 1.0
    with pytest.raises(ValueError, match="missing.*'lin.weight'"):
        load_model_weights(_Lin(), tmp_path)
    with pytest.raises(FileNotFoundError, match="has no weights: none of model.safetensors"):
        load_model_weights(model, tmp_path / "nowhere")


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)


def test_tied_weights_load_from_a_save_pretrained_checkpoint(tmp_path):
    from tiny import tiny_gpt2

    from cadence.checkpoint_io.formats import load_model_weights, save_model_weights

    source, target = tiny_gpt2(seed=1), tiny_gpt2(seed=2)
    save_model_weights(source, tmp_path)  # save_pretrained stores the tied lm_head once
    load_model_weights(target, tmp_path)
    for name, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[name], value), name
