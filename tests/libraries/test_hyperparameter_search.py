"""Trainer.hyperparameter_search on the real libraries (optuna, ray tune) with a tiny regression model."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from cadence import Trainer, TrainerCallback
from cadence.trainer_utils import BestRun, default_compute_objective
from tiny import RegressionDataset, RegressionModel, args_with
from repo_paths import TESTS

optuna = pytest.importorskip("optuna")
optuna.logging.set_verbosity(optuna.logging.WARNING)

TRAIN, EVAL = RegressionDataset(64, seed=42), RegressionDataset(32, seed=7)


def model_init(trial=None):
    return RegressionModel()


make_args = args_with(per_device_train_batch_size=8, num_train_epochs=2, eval_strategy="epoch", save_strategy="epoch",
                      logging_strategy="no", seed=3)


def listed(values: list[dict]):
    """An hp_space that gives trial n the values values[n] (optuna samples a float range of width 0)."""
    def space(trial):
        chosen = values[trial.number]
        return {k: trial.suggest_float(k, v, v) if isinstance(v, float) else trial.suggest_int(k, v, v)
                for k, v in chosen.items()}
    return space


class Steps(TrainerCallback):
    """Records (output_dir, last global step) of every train() call."""

    def __init__(self):
        self.runs = []

    def on_train_end(self, args, state, control, **kwargs):
        self.runs.append((Path(args.output_dir).name, state.global_step))


def hand_mse(folder: Path) -> float:
    """The eval MSE of the weights saved in ``folder``, computed by hand (no Trainer)."""
    w = load_file(str(folder / "model.safetensors"))
    pred = w["a"] * EVAL.x + w["b"]
    return torch.mean((pred - EVAL.y) ** 2).item()


def test_four_trial_search_best_objective_is_the_retrained_eval_loss(tmp_path):
    values = [{"learning_rate": 0.05, "num_train_epochs": 2}, {"learning_rate": 0.2, "num_train_epochs": 1},
              {"learning_rate": 0.05, "num_train_epochs": 2}, {"learning_rate": 0.2, "num_train_epochs": 3}]
    args = make_args(tmp_path / "search")
    steps = Steps()
    trainer = Trainer(args=args, model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL, callbacks=[steps])
    best = trainer.hyperparameter_search(hp_space=listed(values), n_trials=4, backend="optuna", gc_after_trial=True)

    study = best.run_summary
    objectives = [t.value for t in study.trials]
    assert isinstance(best, BestRun) and len(objectives) == 4
    assert best.objective == min(objectives) and best.run_id == str(objectives.index(min(objectives)))
    # trials 0 and 2 sample the same values: bit-identical objectives mean nothing leaked from trial 0 or 1
    assert objectives[0] == objectives[2]
    assert steps.runs == [("run-0", 16), ("run-1", 8), ("run-2", 16), ("run-3", 24)]  # 8 steps per epoch
    assert trainer.args is args and trainer.args.learning_rate == 5e-5  # the trainer's own arguments come back

    # independent reference: the MSE of the best trial's last checkpoint, by hand (float32 sums in another order)
    run = tmp_path / "search" / f"run-{best.run_id}"
    last = max(run.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    assert best.objective == pytest.approx(hand_mse(last), rel=1e-6)
    # retrained with the best values by a new Trainer: the same eval loss, bit for bit (cadence vs cadence)
    again = Trainer(args=dataclasses.replace(args, output_dir=str(tmp_path / "again"), **best.hyperparameters),
                    model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL)
    again.train()
    assert again.evaluate()["eval_loss"] == best.objective


def test_pruning_stops_a_bad_trial_at_once(tmp_path):
    # eval every 2 steps over 24 steps: lr=0.3 gives eval losses 7.3, 4.8, ... 0.16; lr=1e-5 stays at 10.39
    args = make_args(tmp_path, num_train_epochs=3, eval_strategy="steps", eval_steps=2, save_strategy="no")
    steps = Steps()
    trainer = Trainer(args=args, model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL, callbacks=[steps])
    best = trainer.hyperparameter_search(
        hp_space=listed([{"learning_rate": 0.3}, {"learning_rate": 1e-5}]), n_trials=2, backend="optuna",
        pruner=optuna.pruners.ThresholdPruner(upper=8.0, n_warmup_steps=4),
    )
    study = best.run_summary
    assert [t.state for t in study.trials] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert best.run_id == "0"
    # the good trial reports at every evaluation and trains all 24 steps
    assert sorted(study.trials[0].intermediate_values) == list(range(2, 25, 2))
    # the bad one is pruned at the first evaluation past the warm-up (step 4) and trains not one step more
    assert sorted(study.trials[1].intermediate_values) == [2, 4]
    assert steps.runs == [("run-0", 24), ("run-1", 4)]


def test_sqlite_storage_resumes_an_interrupted_search(tmp_path):
    storage, name = f"sqlite:///{tmp_path / 'search.db'}", "resumable"
    values = [{"learning_rate": lr} for lr in (0.01, 0.2, 0.05, 0.1, 0.02)]

    class Interrupt(TrainerCallback):  # a Ctrl-C in the third trial
        def on_step_end(self, args, state, control, **kwargs):
            if args.output_dir.endswith("run-2") and state.global_step == 3:
                raise KeyboardInterrupt

    first = Trainer(args=make_args(tmp_path), model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL,
                    callbacks=[Interrupt()])
    with pytest.raises(KeyboardInterrupt):
        first.hyperparameter_search(hp_space=listed(values), n_trials=4, backend="optuna", storage=storage, study_name=name)

    second = Trainer(args=make_args(tmp_path), model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL)
    best = second.hyperparameter_search(hp_space=listed(values), n_trials=2, backend="optuna", storage=storage,
                                        study_name=name, load_if_exists=True)
    study = optuna.load_study(study_name=name, storage=storage)
    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]  # the two done before survive
    done = {t.number: t.value for t in study.trials if t.state.name == "COMPLETE"}
    assert best.objective == min(done.values()) and int(best.run_id) == min(done, key=done.get)
    # the numbering goes on after the interrupted trial (stopped before its first save: no folder)
    assert sorted(p.name for p in tmp_path.glob("run-*")) == ["run-0", "run-1", "run-3", "run-4"]


def test_bad_hp_space_key_is_a_clear_error_before_training(tmp_path):
    steps = Steps()
    trainer = Trainer(args=make_args(tmp_path), model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL,
                      callbacks=[steps])
    with pytest.raises(ValueError, match="'learning_rat'.*not a TrainingArguments field"):
        trainer.hyperparameter_search(hp_space=lambda t: {"learning_rat": t.suggest_float("learning_rat", 0.1, 0.2)},
                                      n_trials=1, backend="optuna")
    with pytest.raises(ValueError, match="nested value for 'learning_rate'"):
        trainer.hyperparameter_search(hp_space=lambda t: {"learning_rate": {"low": 0.1}}, n_trials=1, backend="optuna")
    with pytest.raises(ValueError, match="n_jobs=2"):
        trainer.hyperparameter_search(n_trials=1, backend="optuna", n_jobs=2)
    assert steps.runs == []  # nothing trained


def test_needs_model_init_and_a_known_backend(tmp_path):
    trainer = Trainer(RegressionModel(), make_args(tmp_path), train_dataset=TRAIN, eval_dataset=EVAL)
    with pytest.raises(RuntimeError, match="needs a model_init"):
        trainer.hyperparameter_search(n_trials=1, backend="optuna")
    with pytest.raises(ValueError, match="'sigopt' is not built in cadence"):
        trainer.hyperparameter_search(n_trials=1, backend="sigopt")


def test_multi_objective_directions_give_the_pareto_front(tmp_path):
    trainer = Trainer(args=make_args(tmp_path, num_train_epochs=1), model_init=model_init, train_dataset=TRAIN,
                      eval_dataset=EVAL)
    front = trainer.hyperparameter_search(
        hp_space=listed([{"learning_rate": 0.01}, {"learning_rate": 0.1}]), n_trials=2, backend="optuna",
        direction=["minimize", "maximize"], compute_objective=lambda m: [m["eval_loss"], m["eval_loss"]],
    )
    # each trial is best in one direction: both are on the front, each with its two objectives
    assert sorted(run.run_id for run in front) == ["0", "1"]
    assert all(len(run.objective) == 2 and run.objective[0] == run.objective[1] for run in front)


def test_default_objective_is_hf_rule():
    assert default_compute_objective({"eval_loss": 0.5, "epoch": 1.0, "eval_runtime": 3.0}) == 0.5
    # other metrics present: their sum, without the loss (transformers' rule)
    assert default_compute_objective({"eval_loss": 0.5, "eval_acc": 0.75, "eval_f1": 0.5,
                                      "eval_samples_per_second": 9.0}) == 1.25


def test_model_init_receives_the_trial_and_state_records_it(tmp_path):
    seen = []

    def init_with_trial(trial):
        seen.append(None if trial is None else trial.params["learning_rate"])
        return RegressionModel()

    trainer = Trainer(args=make_args(tmp_path, num_train_epochs=1), model_init=init_with_trial, train_dataset=TRAIN,
                      eval_dataset=EVAL)
    assert seen == [None]  # Trainer.__init__ builds a first model with trial=None, as transformers
    trainer.hyperparameter_search(hp_space=listed([{"learning_rate": 0.03}]), n_trials=1, backend="optuna",
                                  hp_name=lambda trial: f"lr-{trial.params['learning_rate']}")
    assert seen == [None, 0.03]
    state = (tmp_path / "lr-0.03" / "checkpoint-8" / "trainer_state.json").read_text()
    assert '"is_hyper_param_search": true' in state and '"trial_name": "lr-0.03"' in state


@pytest.mark.slow
def test_ray_tune_two_trial_local_search(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    # the workers import this module and tiny.py by name
    here = TESTS
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([here, os.path.join(here, "..", "src"), *sys.path]))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        trainer = Trainer(args=make_args(tmp_path / "out", num_train_epochs=3), model_init=model_init,
                          train_dataset=TRAIN, eval_dataset=EVAL)
        best = trainer.hyperparameter_search(
            hp_space=lambda _: {"learning_rate": tune.grid_search([0.1, 1e-5])}, n_trials=1, backend="ray",
            resources_per_trial={"cpu": 1}, scheduler=ASHAScheduler(max_t=10, grace_period=1, reduction_factor=2),
            storage_path=str(tmp_path / "ray"), verbose=0,
        )
    finally:
        ray.shutdown()
    results = best.run_summary
    assert len(results) == 2 and not results.errors
    assert best.hyperparameters["learning_rate"] == 0.1
    # the good trial reports at each of its 3 epoch evaluations (ASHA may stop the bad one after its first)
    best_result = next(r for r in results if r.metrics["trial_id"] == best.run_id)
    assert best_result.metrics["training_iteration"] == 3 and best_result.metrics["objective"] == best.objective
    # each trial's checkpoints are in output_dir/run-{trial_id}; the best's last one holds the best objective
    run = tmp_path / "out" / f"run-{best.run_id}"
    assert best.objective == pytest.approx(hand_mse(run / "checkpoint-24"), rel=1e-6)


@pytest.mark.slow
def test_under_torchrun_every_process_trains_process_0s_trials(tmp_path):
    import json

    from dist_exit import assert_finished, launch

    out = str(tmp_path / "hp")
    proc = launch("ddp_hp_worker.py", out, timeout=300)
    assert_finished(proc, 2)
    zero, one = (json.loads(Path(f"{out}.{rank}.json").read_text()) for rank in (0, 1))
    # each process samples with its own seed, yet both trained process 0's values, trial by trial
    assert len(zero["trials"]) == 4 and zero["trials"] == one["trials"]
    assert [t["learning_rate"] for t in zero["trials"]] == [t["trial_params"]["learning_rate"] for t in zero["trials"]]
    assert [Path(t["output_dir"]).name for t in zero["trials"]] == ["run-0", "run-1", "run-2", "run-3"]
    # lr=1e-5 trials are pruned at step 4 on both processes together; lr=0.3 ones train all 24 steps
    assert {t["learning_rate"]: t["steps"] for t in zero["trials"]} == {0.3: 24, 1e-5: 4}
    assert zero["best"] is not None and one["best"] is None  # transformers: only process 0 returns the best run


def test_trial_arguments_cast_like_transformers_and_keep_ratios(tmp_path):
    from cadence.hyperparameter_search import trial_arguments

    base = make_args(tmp_path)
    args = trial_arguments(base, {"seed": 17.8, "warmup_steps": 0.1, "lr_scheduler_type": "cosine"}, str(tmp_path / "r"))
    assert args.seed == 17 and isinstance(args.seed, int)  # ray's tune.uniform seed: cast to the field's int
    assert args.warmup_steps == 0.1  # a float field keeps a ratio (never cast to the default's int)
    assert args.lr_scheduler_type == "cosine" and args.output_dir == str(tmp_path / "r") and base.seed == 3


def test_single_objective_maximize_picks_the_largest_objective(tmp_path):
    """direction="maximize" on one objective: the best run is the largest. Independent reference: lr=1e-5 leaves
    the start's eval loss (10.39) nearly as it is while 0.05 and 0.2 lower it, so trial 1 has the largest loss."""
    trainer = Trainer(args=make_args(tmp_path, num_train_epochs=1, save_strategy="no"), model_init=model_init,
                      train_dataset=TRAIN, eval_dataset=EVAL)
    best = trainer.hyperparameter_search(
        hp_space=listed([{"learning_rate": 0.05}, {"learning_rate": 1e-5}, {"learning_rate": 0.2}]), n_trials=3,
        backend="optuna", direction="maximize")
    objectives = [t.value for t in best.run_summary.trials]
    assert best.run_id == "1" and best.objective == max(objectives) > 10 > max(objectives[0], objectives[2])


@pytest.mark.parametrize("space, shown", [(lambda trial: "abc", "'abc' (str)"), (lambda trial: None, "'None' (NoneType)"),
                                          (lambda trial: [0.1], "'[0.1]' (list)")])
def test_hp_space_that_returns_no_dict_is_a_clear_error_before_training(tmp_path, space, shown):
    steps = Steps()
    trainer = Trainer(args=make_args(tmp_path), model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL,
                      callbacks=[steps])
    with pytest.raises(TypeError, match=f"hp_space returned {re.escape(shown)}, not a dict"):
        trainer.hyperparameter_search(hp_space=space, n_trials=1, backend="optuna")
    assert steps.runs == []


def test_trial_values_of_the_wrong_type_name_the_field_and_bool_text_is_read(tmp_path):
    from cadence.hyperparameter_search import trial_arguments

    base = make_args(tmp_path)
    with pytest.raises(ValueError, match=r"hp_space returned seed=\[1\], which is not a int"):
        trial_arguments(base, {"seed": [1]}, str(tmp_path / "r"))
    with pytest.raises(ValueError, match="learning_rate='abc' is invalid"):
        trial_arguments(base, {"learning_rate": "abc"}, str(tmp_path / "r"))
    # bool("false") would be True: the text is read as the command line reads it
    assert trial_arguments(base, {"disable_tqdm": "false"}, str(tmp_path / "r")).disable_tqdm is False


def test_all_hyperparameter_search_backends_as_transformers_names_them(tmp_path):
    """transformers' own check (keys in the enum's order) plus its lookups: is_available / pip_install on the class."""
    import transformers.hyperparameter_search as hf

    from cadence.hyperparameter_search import ALL_HYPERPARAMETER_SEARCH_BACKENDS, default_hp_search_backend
    from cadence.trainer_utils import HPSearchBackend

    assert list(ALL_HYPERPARAMETER_SEARCH_BACKENDS) == list(HPSearchBackend)
    assert {k.value for k in hf.ALL_HYPERPARAMETER_SEARCH_BACKENDS} <= {k.value for k in ALL_HYPERPARAMETER_SEARCH_BACKENDS}
    optuna_backend = ALL_HYPERPARAMETER_SEARCH_BACKENDS[HPSearchBackend.OPTUNA]
    assert optuna_backend.is_available() and optuna_backend.name == "optuna"
    assert optuna_backend.pip_install() == hf.ALL_HYPERPARAMETER_SEARCH_BACKENDS[hf.HPSearchBackend.OPTUNA].pip_install()
    assert not ALL_HYPERPARAMETER_SEARCH_BACKENDS[HPSearchBackend.WANDB].is_available()  # not run by cadence
    assert default_hp_search_backend() == hf.default_hp_search_backend() == "optuna"
    trainer = Trainer(args=make_args(tmp_path), model_init=model_init, train_dataset=TRAIN, eval_dataset=EVAL)
    with pytest.raises(ValueError, match="'wandb' is not built in cadence"):
        trainer.hyperparameter_search(n_trials=1, backend="wandb")
