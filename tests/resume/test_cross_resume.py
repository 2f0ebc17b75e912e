"""Each library resumes the other's checkpoints: stopped in one, finished in the other, the run ends
where transformers' unbroken run ends, within float32 rounding (see WEIGHT_ATOL). Bit-identity is
cadence's own promise (cadence resumed vs cadence unbroken: tests/resume/test_resume.py); across two libraries
it holds on some CPUs and not on others. Files, names and formats are shared: model.safetensors + config.json,
optimizer.pt (same parameter-group order), scheduler.pt, rng_state.pth (transformers stores numpy's
state as an array, cadence as a list: each loads the other's), trainer_state.json.
"""

import dataclasses
import logging
import os

import pytest
import torch
from tiny import LMDataset, pad_collate, tiny_gpt2

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402

COMMON = dict(
    per_device_train_batch_size=4, gradient_accumulation_steps=2, num_train_epochs=2, learning_rate=3e-3,
    warmup_steps=2, lr_scheduler_type="cosine", weight_decay=0.1, max_grad_norm=0.5, logging_steps=1,
    report_to="none", disable_tqdm=True, seed=123, use_cpu=True,
)  # 44 rows, batch 4 -> 11 batches an epoch, 6 steps (the last of one batch), 12 steps in all


def stop_at(lib, step):
    class Stop(lib.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                control.should_training_stop = True

    return Stop()


def gpt2(dropout):
    """tiny_gpt2, or the same with dropout (then the RNG states in the checkpoint decide the result).

    ``loss_type`` is set so that transformers too counts a causal LM's items without label position 0
    (it gives GPT2LMHeadModel none); cadence counts them so either way.
    """
    if not dropout:
        model = tiny_gpt2(seed=3)
    else:
        torch.manual_seed(3)
        config = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                         resid_pdrop=0.2, embd_pdrop=0.2, attn_pdrop=0.1)
        model = transformers.GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"
    return model


def run(lib, out_dir, stop=None, resume=None, save_steps=500, dropout=False):
    model = gpt2(dropout)
    args = lib.TrainingArguments(output_dir=out_dir, save_strategy="steps", save_steps=save_steps, **COMMON)
    trainer = lib.Trainer(model=model, args=args, train_dataset=LMDataset(44), data_collator=pad_collate,
                          callbacks=[stop_at(lib, stop)] if stop else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module", params=[False, True], ids=["no_dropout", "dropout"])
def hf_full(tmp_path_factory, request):
    trainer = run(transformers, str(tmp_path_factory.mktemp("hf_full")), dropout=request.param)
    weights = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    return weights, trainer.state.log_history, request.param


# The two libraries run the same float32 arithmetic in different orders in places (the loss scaling, the
# dropout-scaled sums); which CPU kernels run decides whether that rounds differently. Measured: 0 apart on
# one machine, up to 1.7e-6 on an AMD EPYC (weights of scale ~1 after 12 AdamW steps of lr 3e-3). 1e-5 is
# 6x that and ~1000x below what a wrong data position gives (1.1e-2; test_a_wrong_data_position_would_be_caught).
WEIGHT_ATOL = 1e-5


def weight_gap(weights, expected):
    return max((weights[name] - value).abs().max().item() for name, value in expected.items())


def assert_same_weights(weights, expected):
    assert weight_gap(weights, expected) <= WEIGHT_ATOL


def assert_schedule_continues(trainer, hf_history, stop):
    ours = [(h["step"], h["learning_rate"]) for h in trainer.state.log_history if "learning_rate" in h]
    theirs = [(h["step"], h["learning_rate"]) for h in hf_history if "learning_rate" in h]
    assert [s for s, _ in ours] == list(range(1, 13))  # the history before the stop came from the checkpoint
    for (s, a), (_, b) in zip(ours[stop:], theirs[stop:]):
        assert a == pytest.approx(b, rel=1e-12, abs=0), s  # the same formula; python floats, no kernels


@pytest.mark.parametrize("stop", [4, 6])
def test_cadence_resumes_a_transformers_checkpoint(tmp_path, hf_full, stop):
    out = str(tmp_path / "run")
    run(transformers, out, stop=stop, save_steps=stop, dropout=hf_full[2])
    ckpt = os.path.join(out, f"checkpoint-{stop}")
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= set(os.listdir(ckpt))
    trainer = run(cadence, out, resume=ckpt, save_steps=stop, dropout=hf_full[2])
    assert trainer.state.global_step == 12
    assert_same_weights(trainer.model.state_dict(), hf_full[0])
    assert_schedule_continues(trainer, hf_full[1], stop)


@pytest.mark.parametrize("stop", [4, 6])
def test_transformers_resumes_a_cadence_checkpoint(tmp_path, hf_full, stop):
    out = str(tmp_path / "run")
    run(cadence, out, stop=stop, save_steps=stop, dropout=hf_full[2])
    ckpt = os.path.join(out, f"checkpoint-{stop}")
    trainer = run(transformers, out, resume=ckpt, save_steps=stop, dropout=hf_full[2])
    assert trainer.state.global_step == 12
    assert_same_weights(trainer.model.state_dict(), hf_full[0])
    assert_schedule_continues(trainer, hf_full[1], stop)


def test_a_wrong_data_position_would_be_caught(tmp_path, hf_full):
    """The comparison sees the data position: restarting the epoch's data (ignore_data_skip) ends elsewhere."""
    out = str(tmp_path / "run")
    run(transformers, out, stop=4, save_steps=4, dropout=hf_full[2])
    model = gpt2(hf_full[2])
    args = cadence.TrainingArguments(output_dir=out, save_strategy="no", ignore_data_skip=True, **COMMON)
    trainer = cadence.Trainer(model=model, args=args, train_dataset=LMDataset(44), data_collator=pad_collate)
    trainer.train(resume_from_checkpoint=os.path.join(out, "checkpoint-4"))
    assert weight_gap(trainer.model.state_dict(), hf_full[0]) > 100 * WEIGHT_ATOL


@dataclasses.dataclass
class LibraryArgs(transformers.TrainingArguments):
    """A library's arguments (TRL's configs, SentenceTransformerTrainingArguments): transformers pickles this class,
    which lives outside transformers, into every checkpoint's training_args.bin."""

    library_option: int = 1


def test_cadence_resumes_a_transformers_checkpoint_of_a_library_arguments_class(tmp_path, hf_full, caplog):
    """cadence refused such a checkpoint as unsafe, telling the user to use one written by transformers, which wrote
    it. Now training_args.bin is skipped (never unpickled: one log line says so) and the run ends where
    transformers' unbroken run ends."""
    out = str(tmp_path / "run")
    args = LibraryArgs(output_dir=out, save_strategy="steps", save_steps=4, **COMMON)
    transformers.Trainer(model=gpt2(hf_full[2]), args=args, train_dataset=LMDataset(44), data_collator=pad_collate,
                         callbacks=[stop_at(transformers, 4)]).train()
    ckpt = os.path.join(out, "checkpoint-4")
    with caplog.at_level(logging.INFO, logger="cadence"):
        trainer = run(cadence, out, resume=ckpt, save_steps=4, dropout=hf_full[2])
    assert trainer.state.global_step == 12
    assert_same_weights(trainer.model.state_dict(), hf_full[0])
    skipped = [r.getMessage() for r in caplog.records if "training_args.bin pickles" in r.getMessage()]
    assert len(skipped) == 1 and "LibraryArgs" in skipped[0] and "not unpickled" in skipped[0], skipped
