"""Where cadence and transformers still differed, and where transformers changed between versions: each case run on
both libraries with the same input, comparing what a user sees (files left in output_dir, evaluation steps, the
model's mode, the folder a subclass's ``_save`` is given, the losses).

The version switches (``cadence.versions``) are tested on both sides of each change here by setting the version they
follow; the older side's expected values are what transformers 5.3 and 4.57 do on the same run (run with the same
test file under those versions: the test comparing with the installed transformers then checks them directly).
"""

import os

import pytest
import torch
from tiny import ClassifierModel, RegressionDataset, RegressionModel, make_args, word_tokenizer

import cadence
from cadence import versions

transformers = pytest.importorskip("transformers")
LIBS = {"cadence": cadence, "transformers": transformers}


def listing(folder):
    return sorted(os.listdir(folder))


def eval_run(lib, out, max_steps, eval_steps):
    """A regression model trained ``max_steps`` with ``eval_steps``: (the evaluated steps, ``model.training``)."""
    args = make_args(out, lib, max_steps=max_steps, eval_strategy="steps", eval_steps=eval_steps, use_cpu=True,
                     per_device_train_batch_size=4)
    trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                          eval_dataset=RegressionDataset(8))
    trainer.train()
    return [h["step"] for h in trainer.state.log_history if "eval_loss" in h], trainer.model.training


# ---------------------------------------------------------------- the evaluation at max_steps and the mode after it

@pytest.mark.parametrize("max_steps", [8, 9])
def test_last_step_evaluation_and_mode_follow_the_installed_transformers(tmp_path, max_steps):
    """8 steps, eval_steps=3: transformers >= 5.4 evaluates at 3, 6 and 8 and leaves the model in eval mode; 5.3 and
    4.57 at 3 and 6, in training mode. 9 steps end on an evaluation on every version: eval mode."""
    ours = eval_run(cadence, tmp_path / "ours", max_steps, 3)
    theirs = eval_run(transformers, tmp_path / "theirs", max_steps, 3)
    assert ours == theirs


@pytest.mark.parametrize("version,expected", [
    ((4, 57), {8: ([3, 6], True), 9: ([3, 6, 9], False)}),  # what transformers 4.57.6 does on this run
    ((5, 3), {8: ([3, 6], True), 9: ([3, 6, 9], False)}),  # 5.3.0
    ((5, 4), {8: ([3, 6, 8], False), 9: ([3, 6, 9], False)}),  # 5.4.0, the release that added the evaluation
    ((5, 25), {8: ([3, 6, 8], False), 9: ([3, 6, 9], False)}),
])
def test_last_step_evaluation_on_both_sides_of_the_switch(tmp_path, monkeypatch, version, expected):
    monkeypatch.setattr(versions, "installed_transformers", lambda: version)
    for max_steps, (steps, training) in expected.items():
        assert eval_run(cadence, tmp_path / str(max_steps), max_steps, 3) == (steps, training)


def test_without_transformers_the_newest_behaviour(monkeypatch):
    monkeypatch.setattr(versions, "installed_transformers", lambda: None)
    assert versions.evaluates_at_max_steps() is True
    assert versions.evaluates_at_max_steps((5, 3)) is False and versions.evaluates_at_max_steps((5, 4)) is True


def test_the_installed_version_is_read_from_the_package_metadata():
    major, minor = (int(p) for p in transformers.__version__.split(".")[:2])
    assert versions.installed_transformers() == (major, minor)


# ---------------------------------------------------------------- save_total_limit=1 with a best model

def test_save_total_limit_one_leaves_only_the_best_at_the_end(tmp_path):
    """Scores [1, 5, 2, 3, 0, 0]: the best is step 2; during training the newest stays beside it (for a resume), and
    when training ends only the best is left, as transformers leaves it."""
    def run(lib, out):
        scores = iter([1.0, 5.0, 2.0, 3.0, 0.0, 0.0])
        args = make_args(out, lib, max_steps=6, per_device_train_batch_size=4, eval_strategy="steps", eval_steps=1,
                         save_strategy="steps", save_steps=1, save_total_limit=1, metric_for_best_model="score",
                         load_best_model_at_end=True, use_cpu=True)
        seen = []

        class Listing(lib.TrainerCallback):
            def on_save(self, args, state, control, **kwargs):
                seen.append([n for n in listing(out) if n.startswith("checkpoint-")])

        trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(32),
                              eval_dataset=RegressionDataset(4), compute_metrics=lambda p: {"score": next(scores)},
                              callbacks=[Listing()])
        trainer.train()
        return listing(out), seen[-1], trainer.state.best_model_checkpoint

    ours, theirs = run(cadence, str(tmp_path / "ours")), run(transformers, str(tmp_path / "theirs"))
    assert ours[0] == theirs[0] == ["checkpoint-2"]
    assert ours[1] == theirs[1] == ["checkpoint-2", "checkpoint-6"]  # at the last save: the best and the newest
    assert os.path.basename(ours[2]) == os.path.basename(theirs[2]) == "checkpoint-2"


# ---------------------------------------------------------------- a subclass's _save sees checkpoint-N

def test_a_subclass_save_is_given_the_final_checkpoint_name(tmp_path):
    def run(lib, out):
        calls = []

        class Recording(lib.Trainer):
            def _save(self, output_dir=None, state_dict=None):
                complete = os.path.isfile(os.path.join(output_dir, "trainer_state.json"))
                calls.append((os.path.relpath(output_dir, out), complete, lib.trainer_utils.get_last_checkpoint(out)))
                super()._save(output_dir, state_dict)

        args = make_args(out, lib, max_steps=4, per_device_train_batch_size=4, save_strategy="steps", save_steps=2,
                         use_cpu=True)
        Recording(RegressionModel(), args, train_dataset=RegressionDataset(32)).train()
        return calls, listing(out)

    ours, theirs = run(cadence, str(tmp_path / "ours")), run(transformers, str(tmp_path / "theirs"))
    assert [c[0] for c in ours[0]] == [c[0] for c in theirs[0]] == ["checkpoint-2", "checkpoint-4"]
    # cadence's atomic save: while _save writes, the folder is not yet a checkpoint (no trainer_state.json; the
    # newest complete one is the previous), and only the complete folders are left
    assert [(c[1], c[2] and os.path.basename(c[2])) for c in ours[0]] == [(False, None), (False, "checkpoint-2")]
    assert ours[1] == theirs[1] == ["checkpoint-2", "checkpoint-4"]
    for step in (2, 4):
        folder = tmp_path / "ours" / f"checkpoint-{step}"
        assert not folder.is_symlink() and (folder / "model.safetensors").is_file()


def test_a_save_killed_inside_a_subclass_save_leaves_no_checkpoint(tmp_path):
    """The link checkpoint-N -> tmp-checkpoint-N exists only while _save runs: a save that fails there leaves
    neither, and a link a killed process left is removed with its staging folder before the next run trains."""
    from cadence.checkpoint import writer

    out = tmp_path / "run"

    class Failing(cadence.Trainer):
        def _save(self, output_dir=None, state_dict=None):
            super()._save(output_dir, state_dict)
            if self.state.global_step == 4:
                raise OSError(28, "No space left on device")

    args = make_args(out, max_steps=4, per_device_train_batch_size=4, save_strategy="steps", save_steps=2)
    with pytest.raises(OSError):
        Failing(RegressionModel(), args, train_dataset=RegressionDataset(32)).train()
    assert listing(out) == ["checkpoint-2"]
    (out / "tmp-checkpoint-6").mkdir()  # what a kill inside _save leaves
    os.symlink("tmp-checkpoint-6", out / "checkpoint-6")
    os.symlink(out / "checkpoint-2", out / "checkpoint-8")  # a user's own link: kept
    assert sorted(p.name for p in writer.remove_incomplete(out)) == ["checkpoint-6", "tmp-checkpoint-6"]
    assert listing(out) == ["checkpoint-2", "checkpoint-8"]


# ---------------------------------------------------------------- a collator returning collated dicts

class PairEncoder(torch.nn.Module):
    """A retrieval model: queries and passages embedded by one mean-pooled embedding."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(32, 8)

    def forward(self, input_ids, attention_mask):
        mask = attention_mask[..., None].float()
        return (self.emb(input_ids) * mask).sum(1) / mask.sum(1)


def pair_trainer_class(lib):
    class PairTrainer(lib.Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            queries, passages = inputs  # two collated batches: in-batch negatives
            scores = model(**queries) @ model(**passages).T
            loss = torch.nn.functional.cross_entropy(scores, torch.arange(len(scores)))
            return (loss, scores) if return_outputs else loss

    return PairTrainer


def test_a_collator_returning_a_tuple_of_collated_batches_trains_as_in_transformers(tmp_path):
    tokenizer = word_tokenizer()
    rows = [{"query": f"w{i} w{i + 1}", "passage": f"w{i + 1} w{i + 2} w{i}"} for i in range(16)]

    def collate(features):
        encode = lambda key: tokenizer([f[key] for f in features], padding=True, return_tensors="pt",  # noqa: E731
                                       return_token_type_ids=False)
        return encode("query"), encode("passage")

    def run(lib, out):
        args = make_args(out, lib, max_steps=4, per_device_train_batch_size=4, logging_steps=1, use_cpu=True,
                         remove_unused_columns=False, learning_rate=0.1)
        trainer = pair_trainer_class(lib)(PairEncoder(), args, train_dataset=rows, data_collator=collate)
        trainer.train()
        return [h["loss"] for h in trainer.state.log_history if "loss" in h], trainer.model.emb.weight.detach()

    (our_losses, ours), (their_losses, theirs) = run(cadence, tmp_path / "ours"), run(transformers, tmp_path / "theirs")
    assert len(our_losses) == 4
    assert our_losses == pytest.approx(their_losses, abs=1e-4)  # 4.x logs the loss rounded to 4 decimals
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_list_of_samples_is_still_refused(out_dir):
    tokenizer = word_tokenizer()
    rows = [dict(tokenizer("w1 w2", return_tensors="pt")) | {"labels": torch.tensor(1)} for _ in range(8)]
    trainer = cadence.Trainer(ClassifierModel(), make_args(out_dir, max_steps=1, per_device_train_batch_size=4),
                              train_dataset=rows, data_collator=lambda samples: samples)
    with pytest.raises(TypeError, match="data_collator returned a list of 4 dict"):
        trainer.train()


# ---------------------------------------------------------------- the collator's tokenizer in checkpoints

def test_the_collators_tokenizer_is_saved_when_there_is_no_processing_class(tmp_path):
    tokenizer = word_tokenizer()
    texts = ["w1 w2", "w3 w4 w5", "w6", "w7 w8"] * 2
    rows = [dict(tokenizer(t)) | {"labels": len(t.split()) % 3} for t in texts]

    def run(lib, out):
        args = make_args(out, lib, max_steps=2, per_device_train_batch_size=4, save_strategy="steps", save_steps=2,
                         use_cpu=True)
        collator = transformers.DataCollatorWithPadding(tokenizer)
        trainer = lib.Trainer(ClassifierModel(), args, train_dataset=rows, data_collator=collator)
        assert trainer.processing_class is None
        trainer.train()
        trainer.save_model(os.path.join(out, "final"))
        return ({n for n in listing(os.path.join(out, "checkpoint-2")) if "token" in n},
                {n for n in listing(os.path.join(out, "final")) if "token" in n})

    ours, theirs = run(cadence, str(tmp_path / "ours")), run(transformers, str(tmp_path / "theirs"))
    assert ours == theirs
    assert {"tokenizer.json", "tokenizer_config.json"} <= ours[0] and {"tokenizer.json"} <= ours[1]


# ---------------------------------------------------------------- negative intervals

@pytest.mark.parametrize("overrides", [
    {"save_steps": -1}, {"eval_steps": -1}, {"logging_steps": -1}, {"eval_steps": -0.5}, {"logging_steps": -0.25},
    {"save_steps": -0.5, "eval_steps": -2, "logging_steps": -3},
], ids=str)
def test_a_negative_interval_runs_as_in_transformers(tmp_path, caplog, overrides):
    """transformers accepts a negative logging/eval/save interval and runs it through its own arithmetic; cadence
    does the same, with a warning naming the field: the logged and evaluated steps and the checkpoints match."""
    def run(lib, out):
        base = dict(max_steps=8, per_device_train_batch_size=4, logging_steps=2, eval_strategy="steps", eval_steps=3,
                    save_strategy="steps", save_steps=3, use_cpu=True)
        args = make_args(out, lib, **{**base, **overrides})
        trainer = lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                              eval_dataset=RegressionDataset(8))
        trainer.train()
        history = trainer.state.log_history
        return ([h["step"] for h in history if "loss" in h], [h["step"] for h in history if "eval_loss" in h],
                [n for n in listing(out) if n.startswith("checkpoint-")])

    with caplog.at_level("WARNING", logger="cadence.training_args"):
        ours = run(cadence, str(tmp_path / "ours"))
    assert all(f"{name}={value!r} is negative" in caplog.text for name, value in overrides.items())
    assert ours == run(transformers, str(tmp_path / "theirs"))


def test_a_negative_ratio_that_rounds_to_no_steps_is_refused_before_training(out_dir):
    """eval_steps=-0.01 over 8 steps: ceil(-0.08) = 0 steps between evaluations (transformers: ZeroDivisionError at
    the first step); refused with the field and the fix before any step."""
    args = make_args(out_dir, max_steps=8, per_device_train_batch_size=4, eval_strategy="steps", eval_steps=-0.01)
    trainer = cadence.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(64),
                              eval_dataset=RegressionDataset(8))
    with pytest.raises(ValueError, match=r"eval_steps=-0.01 is invalid for a run of 8 steps"):
        trainer.train()
    assert trainer.state.global_step == 0


# ---------------------------------------------------------------- trackers: transformers' method names and state

def test_a_tracker_subclass_overriding_setup_is_called_as_in_transformers(tmp_path, monkeypatch):
    """Users override ``setup`` on transformers' tracker callbacks to change how the run is created: the override is
    called (with transformers' signature for that tracker) where transformers calls it, and the run is opened by
    ``super().setup``."""
    pytest.importorskip("dvclive")
    from cadence.integrations.dvclive import DVCLiveCallback
    from transformers.integrations import DVCLiveCallback as TheirDVCLive

    def run(base, lib, folder):
        monkeypatch.chdir(folder)
        calls = []

        class Named(base):
            def setup(self, args, state, model):  # transformers' DVCLive signature: no **kwargs
                calls.append((state.global_step, self._initialized))
                super().setup(args, state, model)
                calls.append(self._initialized)

        args = make_args(folder / "out", lib, max_steps=2, per_device_train_batch_size=4, logging_steps=1,
                         use_cpu=True)
        lib.Trainer(RegressionModel(), args, train_dataset=RegressionDataset(16), callbacks=[Named()]).train()
        return calls, sorted(p.name for p in (folder / "dvclive" / "plots" / "metrics").iterdir())

    (tmp_path / "ours").mkdir(), (tmp_path / "theirs").mkdir()
    ours = run(DVCLiveCallback, cadence, tmp_path / "ours")
    assert ours == run(TheirDVCLive, transformers, tmp_path / "theirs")
    assert ours[0] == [(0, False), True]


def test_kubeflow_keeps_transformers_state_and_private_methods(tmp_path, monkeypatch):
    """transformers' tests and subclasses drive KubeflowCallback through ``_initialized``, ``_metrics``,
    ``_update_status`` (a bool: sent, or not: throttled, no URL) and ``_get_token``: the same calls on both, against
    one local status server, give the same answers and the same requests."""
    from test_trackers_more import StatusServer, kubeflow_env

    from cadence.integrations.kubeflow import KubeflowCallback

    their_module = transformers.integrations.integration_utils
    if not hasattr(their_module, "KubeflowCallback"):
        pytest.skip(f"transformers {transformers.__version__} has no KubeflowCallback")
    TheirKubeflow = their_module.KubeflowCallback

    def drive(cls, server):
        kubeflow_env(monkeypatch, tmp_path, server.url)
        callback, state = cls(), cadence.TrainerState(max_steps=10, global_step=0, epoch=0.0)
        seen = [callback._initialized, callback._get_token()]
        callback.on_train_begin(None, state, None)  # 0%, forced
        callback.on_log(None, state, None, logs={"loss": 0.5, "learning_rate": 0.1, "note": "text"})
        seen += [callback._initialized, dict(callback._metrics)]
        seen.append(callback._update_status(progress_percent=40))  # within the 5 s interval: not sent
        seen.append(callback._update_status(progress_percent=50, metrics={"x": 1}, force=True))
        state.global_step = 10
        callback.on_train_end(None, state, None)  # 100%, forced
        monkeypatch.delenv("KUBEFLOW_TRAINER_SERVER_URL")
        seen.append(callback._update_status(progress_percent=60, force=True))  # no URL: nothing sent
        sent = [(s["progressPercentage"], [m["name"] for m in s.get("metrics", [])]) for s in server.statuses()]
        server.received.clear()
        return seen, sent

    with StatusServer() as server:
        ours, theirs = drive(KubeflowCallback, server), drive(TheirKubeflow, server)
    assert ours == theirs
    assert ours[0] == [False, "secret-token", True, {"loss": 0.5, "learning_rate": 0.1}, False, True, False]
    assert ours[1] == [(0, ["total_steps"]), (50, ["x"]), (100, ["loss", "learning_rate"])]


# ---------------------------------------------------------------- a deliberate difference kept

def test_a_checkpoint_whose_weights_do_not_fit_is_refused_where_transformers_resumes_from_fresh_weights(tmp_path):
    """A subclass's ``_save`` renamed the weights' keys: transformers' resume loads them with ``strict=False``, warns,
    and goes on from the model's fresh weights (its trained ones silently lost); cadence refuses the resume, naming
    the keys (docs/differences.md)."""
    from safetensors.torch import save_file

    class Model(RegressionModel):
        _keys_to_ignore_on_save = None  # read by transformers' load warnings (a PreTrainedModel attribute)

    def resume(lib, out):
        class Renaming(lib.Trainer):
            def _save(self, output_dir=None, state_dict=None):
                os.makedirs(output_dir, exist_ok=True)
                weights = {f"renamed.{k}": v.detach().clone() for k, v in self.model.state_dict().items()}
                save_file(weights, os.path.join(output_dir, "model.safetensors"))

        args = make_args(out, lib, max_steps=2, per_device_train_batch_size=4, save_strategy="steps", save_steps=2,
                         learning_rate=0.5, use_cpu=True)
        trained = Renaming(Model(), args, train_dataset=RegressionDataset(16))
        trained.train()
        fresh = lib.Trainer(Model(a=0.25, b=-0.25), args, train_dataset=RegressionDataset(16))
        fresh.train(resume_from_checkpoint=os.path.join(out, "checkpoint-2"))  # nothing left to train: loads only
        return [float(p) for p in fresh.model.parameters()], [float(p) for p in trained.model.parameters()]

    resumed, trained = resume(transformers, str(tmp_path / "theirs"))
    assert resumed == [0.25, -0.25] and resumed != trained  # transformers: the fresh weights, the trained ones lost
    with pytest.raises(ValueError, match=r"do not fit Model: missing \['a', 'b'\], unexpected "
                                         r"\['renamed.a', 'renamed.b'\]"):
        resume(cadence, str(tmp_path / "ours"))


def test_eval_steps_falling_back_to_a_negative_logging_steps_is_refused_as_in_transformers(tmp_path):
    kw = dict(eval_strategy="steps", logging_steps=-1, report_to="none", use_cpu=True)
    with pytest.raises(ValueError, match="requires either non-zero --eval_steps or --logging_steps"):
        transformers.TrainingArguments(str(tmp_path / "theirs"), **kw)
    with pytest.raises(ValueError, match=r"eval_steps=None is invalid: .*logging_steps=-1"):
        cadence.TrainingArguments(str(tmp_path / "ours"), **kw)
