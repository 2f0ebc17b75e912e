"""A subclass's ``_save`` writes the model files of every checkpoint and of ``save_model()``, as transformers calls
it: the library's own layout (here a wrapped encoder in a sub-folder with its config), resumable and loadable."""

import copy
import os
import shutil

import pytest
import torch
from torch import nn
from tiny import LMDataset, pad_collate, tiny_gpt2

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402

CADENCE_ONLY = {"loop_state.json", "checkpoint_manifest.json", "training_args.json", "training_args.bin"}


class Wrapper(nn.Module):
    """A library's model: a transformers model inside a plain module (sentence-transformers' shape)."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids, labels=None):
        return self.encoder(input_ids=input_ids, labels=labels)


def own_layout(lib):
    class OwnLayout(lib.Trainer):
        """Saves only ``encoder/`` (the inner model's save_pretrained: config.json + weights) and resumes from it."""

        calls = []

        def _save(self, output_dir=None, state_dict=None):
            type(self).calls.append((type(output_dir).__name__, state_dict))
            if self.args.should_save:
                self.model.encoder.save_pretrained(os.path.join(output_dir, "encoder"))

        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            loaded = transformers.GPT2LMHeadModel.from_pretrained(os.path.join(resume_from_checkpoint, "encoder"))
            (model or self.model).encoder.load_state_dict(loaded.state_dict())

    OwnLayout.calls = []
    return OwnLayout


def fit(lib, out, resume=None, **kw):
    torch.manual_seed(0)
    model = Wrapper(copy.deepcopy(ENCODER))
    args = lib.TrainingArguments(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3,
                                 logging_steps=1, save_strategy="steps", save_steps=2, report_to="none",
                                 disable_tqdm=True, seed=3, use_cpu=True, **kw)
    trainer = own_layout(lib)(model, args, train_dataset=LMDataset(24), data_collator=pad_collate)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


ENCODER = tiny_gpt2(seed=1)
ENCODER.loss_type = "ForCausalLM"  # transformers then counts the shifted labels as cadence does


def files(folder):
    return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)


@pytest.mark.slow  # two GPT-2 runs of 6 steps with 3 saves, and a resume: ~40 s each on a shared CPU
@pytest.mark.parametrize("async_save", [False, True])
def test_a_subclasss_save_writes_checkpoints_and_the_saved_model(tmp_path, async_save):
    """cadence never called a subclass's _save: its checkpoints held the whole wrapper (model.safetensors, keys
    prefixed ``encoder.``) and no encoder/ folder, so the library's resume found no weights and its saved model did
    not load with from_pretrained."""
    ours = fit(cadence, tmp_path / "cd", async_save=async_save)
    theirs = fit(transformers, tmp_path / "hf")
    # called as transformers calls it: a str path, no state dict (one process), once per checkpoint
    assert type(ours).calls == type(theirs).calls == [("str", None)] * 3
    for step in (2, 4, 6):
        mine, hf = files(tmp_path / "cd" / f"checkpoint-{step}"), files(tmp_path / "hf" / f"checkpoint-{step}")
        assert set(mine) - set(hf) <= CADENCE_ONLY and set(hf) - set(mine) <= {"training_args.bin"}, (mine, hf)
        assert "model.safetensors" not in mine and "encoder/config.json" in mine
    losses = [h["loss"] for h in ours.state.log_history if "loss" in h]
    assert losses == pytest.approx([h["loss"] for h in theirs.state.log_history if "loss" in h], rel=1e-5)

    ours.save_model(str(tmp_path / "final"))
    assert type(ours).calls[-1] == ("str", None) and files(tmp_path / "final")[0].startswith("encoder/")
    loaded = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path / "final" / "encoder"))
    for name, value in ours.model.encoder.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name

    # the checkpoint resumes through the library's own loading, bit-identical to the unbroken run
    shutil.copytree(tmp_path / "cd" / "checkpoint-2", tmp_path / "r" / "checkpoint-2")
    resumed = fit(cadence, tmp_path / "r", resume=True, async_save=async_save)
    for name, value in ours.model.state_dict().items():
        assert torch.equal(resumed.model.state_dict()[name], value), name
