"""``patch_transformers()`` then ``unpatch_transformers()`` in one process: the same script runs on cadence (patched),
then on transformers' own classes (unpatched), and both runs are compared.

Logging: transformers' library root logger (``transformers``) does not pass records on to Python's root logger, and
users and transformers' own tests read the Trainer's messages through it: ``transformers.logging.set_verbosity_*()``
sets what shows, ``CaptureLogger(transformers.logging.get_logger())`` captures. While patched, cadence's loggers are
its children, so both apply to cadence's messages; ``unpatch_transformers()`` puts them back.

Names: transformers' ``DEFAULT_CALLBACKS``, its modules' ``logger`` and its JIT checkpoint callback are cadence's while
patched (checked on the patched side only).

Schedules: a scheduler a script builds from ``transformers.optimization`` (``GreedyLR``, which steps on the
evaluation metric, not every optimizer step) is cadence's class while patched, so cadence's Trainer steps it as
transformers' Trainer steps transformers' own.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import dist_exit

# One process: the same runs on cadence (patched), then, after unpatch_transformers(), on transformers' own Trainer.
CODE = textwrap.dedent("""
    import json, logging, sys, torch
    import cadence.patch

    ours = logging.getLogger("cadence")
    ours.setLevel(logging.CRITICAL)  # the application's own setting before the patch: it must come back
    before = [ours.parent.name, ours.level]
    cadence.patch.patch_transformers()
    import transformers
    import transformers.trainer
    from unittest.mock import patch
    from transformers.testing_utils import CaptureLogger
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    class Recorder(transformers.TrainerCallback):
        pass

    args = transformers.TrainingArguments(sys.argv[1] + "/out", report_to="none", use_cpu=True)
    with patch("transformers.trainer_callback.logger.warning") as warn_mock:
        transformers.Trainer(torch.nn.Linear(1, 1), args, callbacks=[Recorder, Recorder])
    args = transformers.TrainingArguments(sys.argv[1] + "/jit", report_to="none", use_cpu=True,
                                          enable_jit_checkpoint=True)
    jit = transformers.Trainer(torch.nn.Linear(1, 1), args).callback_handler.callbacks
    callbacks = {"defaults": [c.__module__ for c in transformers.trainer.DEFAULT_CALLBACKS],
                 "warned": [str(Recorder) in c[0][0] for c in warn_mock.call_args_list],
                 "jit": sum(isinstance(c, JITCheckpointCallback) for c in jit)}

    class Line(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x, labels):
            return {"loss": ((self.a * x - labels) ** 2).mean()}

    data = [{"x": torch.tensor([float(i)]), "labels": torch.tensor([2.0 * i])} for i in range(4)]
    # (verbosity before the Trainer is built, its log_level, verbosity set between building it and train())
    CASES = [("error", "passive", None), ("info", "passive", None), ("info", "error", None),
             ("error", "passive", "info")]

    def runs(out):
        seen, classes = [], set()
        for i, (verbosity, log_level, later) in enumerate(CASES):
            getattr(transformers.logging, "set_verbosity_" + verbosity)()
            with CaptureLogger(transformers.logging.get_logger()) as cl:
                args = transformers.TrainingArguments(f"{out}/{i}", max_steps=1, per_device_train_batch_size=2,
                                                      report_to="none", save_strategy="no", use_cpu=True,
                                                      disable_tqdm=True, log_level=log_level)
                trainer = transformers.Trainer(Line(), args, train_dataset=data)
                if later:
                    getattr(transformers.logging, "set_verbosity_" + later)()
                trainer.train()
            seen.append("Running training" in cl.out)
            classes.add(type(trainer).__module__)
        return seen, sorted(classes)

    def greedy(out, lib=transformers):
        from transformers.optimization import GreedyLR  # as a script imports it: cadence's class while patched

        torch.manual_seed(0)
        model = Line()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        scheduler = GreedyLR(optimizer, factor=0.5, patience=1, cooldown=0)
        args = lib.TrainingArguments(out, num_train_epochs=4, per_device_train_batch_size=2,
                                              per_device_eval_batch_size=2, eval_strategy="epoch",
                                              metric_for_best_model="eval_loss", logging_steps=1, report_to="none",
                                              save_strategy="no", use_cpu=True, disable_tqdm=True)
        trainer = lib.Trainer(model, args, train_dataset=data, eval_dataset=data, optimizers=(optimizer, scheduler))
        trainer.train()
        return {"lrs": [round(log["learning_rate"], 8) for log in trainer.state.log_history if "loss" in log],
                "eval_losses": [log["eval_loss"] for log in trainer.state.log_history if "eval_loss" in log],
                "a": model.a.item(), "scheduler": type(trainer.lr_scheduler).__module__}

    patched = runs(sys.argv[1] + "/cadence")
    patched_greedy = greedy(sys.argv[1] + "/cadence-greedy")
    cadence.patch.unpatch_transformers()
    after = [ours.parent.name, ours.level]
    reference = runs(sys.argv[1] + "/transformers")
    reference_greedy = greedy(sys.argv[1] + "/transformers-greedy")
    import cadence
    plain_greedy = greedy(sys.argv[1] + "/plain-greedy", lib=cadence)  # cadence's Trainer, transformers' GreedyLR
    print(json.dumps({"callbacks": callbacks, "patched": patched, "reference": reference, "before": before,
                      "after": after, "patched_greedy": patched_greedy, "reference_greedy": reference_greedy,
                      "plain_greedy": plain_greedy}))
""")


@pytest.fixture(scope="module")
def seen(tmp_path_factory):
    """What the script saw: one process, patched then unpatched (each fresh process importing transformers costs
    seconds, so the checks that need a patched process share this one)."""
    tmp_path = tmp_path_factory.mktemp("patch_in_process")
    proc = subprocess.run([sys.executable, "-c", CODE, str(tmp_path)], cwd=tmp_path, env=dist_exit.worker_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_patch_points_default_callbacks_and_loggers_at_cadence(seen):
    """transformers' own tests read ``transformers.trainer.DEFAULT_CALLBACKS`` and patch
    ``transformers.trainer_callback.logger.warning``, and look for ``transformers.trainer_jit_checkpoint``'s
    callback among the Trainer's: after the patch all reach cadence's (the list holds cadence's DefaultFlowCallback;
    the duplicate-callback warning cadence logs goes through the patched method; the JIT callback is found)."""
    assert seen["callbacks"] == {"defaults": ["cadence.trainer_callback"], "warned": [True], "jit": 1}, seen


def test_patched_trainer_logs_through_transformers_root_logger(seen):
    """Captured by ``CaptureLogger(transformers.logging.get_logger())`` and following ``set_verbosity_*()`` (before
    the Trainer is built, through its ``log_level``, and after it is built) exactly as transformers' own Trainer's
    messages are, in the same process; after ``unpatch_transformers()`` the ``cadence`` logger has its parent and level
    from before the patch."""
    assert seen["patched"][1] == ["cadence.trainer"] and seen["reference"][1] == ["transformers.trainer"], seen
    assert seen["reference"][0] == [False, True, False, True], seen  # transformers' own behaviour
    assert seen["patched"][0] == seen["reference"][0], seen
    assert seen["after"] == seen["before"] == ["root", 50], seen


def test_greedy_lr_from_transformers_steps_on_the_metric_as_in_transformers(seen):
    """``transformers.optimization.GreedyLR`` given to the Trainer (``optimizers=``): patched, it is cadence's class and
    steps once per evaluation on ``eval_loss``, so the learning rates, evaluation losses and weights equal
    transformers' run on the same script (before, cadence stepped it every optimizer step with no metric: TypeError)."""
    ours, theirs = seen["patched_greedy"], seen["reference_greedy"]
    assert ours["scheduler"].startswith("cadence.") and theirs["scheduler"] == "transformers.optimization", seen
    assert len(set(theirs["lrs"])) > 1, theirs  # the schedule did change the lr: the comparison means something
    assert ours["lrs"] == theirs["lrs"], (ours, theirs)
    assert ours["eval_losses"] == pytest.approx(theirs["eval_losses"], rel=1e-5)
    assert ours["a"] == pytest.approx(theirs["a"], rel=1e-5)


def test_transformers_greedy_lr_on_an_unpatched_cadence_trainer_steps_on_the_metric(seen):
    """Without the patch, a script may hand cadence's Trainer transformers' own ``GreedyLR``: it steps on the
    evaluation metric too (before, cadence stepped it every optimizer step with no metric: TypeError), so the run
    equals transformers' Trainer with the same scheduler."""
    ours, theirs = seen["plain_greedy"], seen["reference_greedy"]
    assert ours["scheduler"] == theirs["scheduler"] == "transformers.optimization", seen
    assert ours["lrs"] == theirs["lrs"], (ours, theirs)
    assert ours["eval_losses"] == pytest.approx(theirs["eval_losses"], rel=1e-5)
    assert ours["a"] == pytest.approx(theirs["a"], rel=1e-5)
