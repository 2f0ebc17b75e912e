"""The Trainer reaches checkpoints only through its ``Checkpointer``: the verbs of one save and one resume, in order.

A real tiny run saves ``checkpoint-2`` and stops; a second Trainer resumes from it. Every call into the files layer
(``save_load.save``/``load``/``finish_rotation``, the engine's weight loading, the ``output_dir`` lock, the background
writer's wait) is recorded with the Checkpointer verb it runs inside: a Trainer that bypassed the Checkpointer (called
``save_load`` or the Backend's weight loading itself) leaves a call recorded outside every verb, and the test fails.
"""

import ast
import os
from pathlib import Path

import pytest
import torch
from tiny import RegressionDataset, RegressionModel, args_with, stop_at

import cadence
from cadence import Trainer
from cadence import output_guard
from cadence.backend import Backend
from cadence.checkpoint import background, manager, save_load

make_args = args_with(per_device_train_batch_size=4, learning_rate=0.1, max_steps=4, save_strategy="steps",
                      save_steps=2, logging_steps=1, seed=3, restore_callback_states_from_checkpoint=True)
VERBS = ("poll", "save", "abandon", "finish", "save_model", "claim_output_dir", "release_output_dir", "resume_folder",
         "load_weights", "load", "load_optimizer_and_scheduler", "load_callback_states", "load_best_model")


@pytest.fixture
def recorded(monkeypatch):
    """``(verbs, outside)``: the Checkpointer verbs the Trainer called (outermost only; a run of the same verb kept
    once; a ``poll`` only when it fired ``on_save``), and the files-layer calls made outside every verb."""
    verbs, outside, depth = [], [], [0]

    def verb(name, real):
        def call(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = real(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0 and (name != "poll" or result) and (not verbs or verbs[-1] != name):
                verbs.append(name)
            return result
        return call

    def files_layer(name, real):
        def call(*args, **kwargs):
            if depth[0] == 0:
                outside.append(name)
            return real(*args, **kwargs)
        return call

    for name in VERBS:
        monkeypatch.setattr(manager.Checkpointer, name, verb(name, getattr(manager.Checkpointer, name)))
    for name in ("save", "load", "finish_rotation", "save_model"):
        monkeypatch.setattr(save_load, name, files_layer(f"save_load.{name}", getattr(save_load, name)))
    for cls, name in ((Backend, "load_model_weights"), (Backend, "load_optimizer_state"),
                      (output_guard.OutputDirLock, "acquire"), (output_guard.OutputDirLock, "release"),
                      (background.BackgroundWriter, "wait")):
        monkeypatch.setattr(cls, name, files_layer(f"{cls.__name__}.{name}", getattr(cls, name)))
    return verbs, outside


def test_one_save_and_one_resume_go_through_the_checkpointer(tmp_path, recorded):
    verbs, outside = recorded
    out = str(tmp_path / "run")
    trainer = Trainer(RegressionModel(), make_args(out, async_save=True), train_dataset=RegressionDataset(32),
                      callbacks=[stop_at(2)])
    trainer.train()
    assert sorted(os.listdir(out)) == ["checkpoint-2"] and trainer.state.global_step == 2
    # the save: the output_dir claimed, checkpoint-2 written (in the background), its on_save fired once written,
    # the end-of-training rotation, the lock released
    assert verbs == ["claim_output_dir", "resume_folder", "save", "poll", "finish", "release_output_dir"]
    assert outside == []

    verbs.clear()
    resumed = Trainer(RegressionModel(), make_args(out, async_save=True), train_dataset=RegressionDataset(32))
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4 and torch.isfinite(resumed.model.a).item()
    assert (Path(out) / "checkpoint-4").is_dir()
    # the resume, each piece when its objects exist: which checkpoint, the weights into the bare model, the rest once
    # the optimizer exists, the callbacks' states; then the run goes on and saves checkpoint-4 as the first one saved
    assert verbs == ["claim_output_dir", "resume_folder", "load_weights", "load", "load_callback_states", "save",
                     "poll", "finish", "release_output_dir"]
    assert outside == []


def test_the_trainer_imports_two_modules_of_the_checkpoint_packages():
    """trainer.py names the Checkpointer's module and the signals' callback, nothing else of checkpoint/ or
    checkpoint_io/ (a subclass's override of a transformers-named method is what stays open)."""
    tree = ast.parse((Path(cadence.__file__).parent / "trainer.py").read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and (node.module or "").startswith("checkpoint"):
            modules.update([node.module] if "." in node.module else [f"{node.module}.{a.name}" for a in node.names])
    assert modules == {"checkpoint.manager", "checkpoint.signals"}
