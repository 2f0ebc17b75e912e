"""Seq2SeqTrainer / Seq2SeqTrainingArguments: a tiny BART (built from a config, no download) trains, evaluates and
predicts with generation as on transformers; gradient accumulation is exact for padded seq2seq labels; the
generation options reach generate(); bad options fail at construction."""

import dataclasses
import json

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

import cadence  # noqa: E402
from cadence import Seq2SeqTrainer, Seq2SeqTrainingArguments  # noqa: E402

VOCAB, PAD, EOS = 40, 1, 2


def tiny_bart(seed=0, as_shipped=False):
    torch.manual_seed(seed)
    config = transformers.BartConfig(
        vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=EOS)
    model = transformers.BartForConditionalGeneration(config)
    # BART takes **kwargs but averages its own loss: transformers would count each micro-batch mean whole (GA times
    # the gradient, README "Deliberate differences"); this makes it divide by GA, exact for equal-length labels
    if not as_shipped:
        model.accepts_loss_kwargs = False
    return model


def rows(n, seed=1, label_lengths=(5,)):
    """Sources of 4-9 tokens; the target is the first tokens reversed, then eos."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        src = torch.randint(3, VOCAB, (int(torch.randint(4, 10, (1,), generator=g)),), generator=g)
        k = label_lengths[i % len(label_lengths)] - 1
        out.append({"input_ids": src, "labels": torch.cat([src[:k].flip(0), torch.tensor([EOS])])})
    return out


def collate(features):
    n, m = max(len(f["input_ids"]) for f in features), max(len(f["labels"]) for f in features)
    batch = {"input_ids": torch.full((len(features), n), PAD), "attention_mask": torch.zeros((len(features), n), dtype=torch.long),
             "labels": torch.full((len(features), m), -100)}
    for i, f in enumerate(features):
        batch["input_ids"][i, : len(f["input_ids"])] = f["input_ids"]
        batch["attention_mask"][i, : len(f["input_ids"])] = 1
        batch["labels"][i, : len(f["labels"])] = f["labels"]
    return batch


def token_accuracy(prediction):
    preds, labels = prediction.predictions[:, 1:6], prediction.label_ids[:, :5]  # after the decoder start token
    return {"token_accuracy": float((preds == labels).mean())}


def seq2seq_args(lib, out, **overrides):
    options = dict(predict_with_generate=True, generation_num_beams=2, generation_max_length=8,
                   per_device_train_batch_size=4, gradient_accumulation_steps=2, per_device_eval_batch_size=4,
                   max_steps=6, learning_rate=3e-3, logging_steps=1, report_to="none", use_cpu=True,
                   save_strategy="no", disable_tqdm=True, seed=3)
    options.update(overrides)
    return lib.Seq2SeqTrainingArguments(str(out), **options)


def test_top_level_and_transformers_module_paths():
    from cadence.trainer_seq2seq import Seq2SeqTrainer as by_path
    from cadence.training_args_seq2seq import Seq2SeqTrainingArguments as args_by_path

    assert by_path is cadence.Seq2SeqTrainer and issubclass(by_path, cadence.Trainer)
    assert args_by_path is cadence.Seq2SeqTrainingArguments and issubclass(args_by_path, cadence.TrainingArguments)
    ours = {f.name: f.default for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    theirs = {f.name: f.default for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)}
    for name in ("sortish_sampler", "predict_with_generate", "generation_max_length", "generation_num_beams",
                 "generation_config"):
        assert ours[name] == theirs[name], name


def test_tiny_bart_trains_generates_and_scores_like_transformers(tmp_path):
    """GA 2, beam search of 2: the same weights, the same generated tokens, the same eval loss and metrics."""
    data = rows(24)
    results = {}
    for lib in (transformers, cadence):
        trainer = lib.Seq2SeqTrainer(tiny_bart(), seq2seq_args(lib, tmp_path / lib.__name__), data_collator=collate,
                                     train_dataset=data[:16], eval_dataset=data[16:], compute_metrics=token_accuracy)
        trainer.train()
        metrics = trainer.evaluate()
        prediction = trainer.predict(data[16:])
        results[lib.__name__] = (trainer.model.state_dict(), metrics, prediction)
    (weights, metrics, prediction), (hf_weights, hf_metrics, hf_prediction) = results["cadence"], results["transformers"]
    for name, value in weights.items():
        assert torch.allclose(value, hf_weights[name], atol=1e-5, rtol=0), name
    assert prediction.predictions.shape == hf_prediction.predictions.shape == (8, 20)  # padded to max_length 20
    assert np.array_equal(prediction.predictions, hf_prediction.predictions)
    assert np.array_equal(prediction.label_ids, hf_prediction.label_ids)
    assert prediction.predictions[:, 0].tolist() == [EOS] * 8  # the decoder start token: these are generated ids
    assert metrics["eval_loss"] == pytest.approx(hf_metrics["eval_loss"], abs=1e-4)
    assert metrics["eval_token_accuracy"] == hf_metrics["eval_token_accuracy"]
    assert prediction.metrics["test_loss"] == pytest.approx(metrics["eval_loss"], rel=1e-12)
    print(f"\n  eval_loss cadence {metrics['eval_loss']:.6f} transformers {hf_metrics['eval_loss']:.6f}")


def test_accumulation_is_exact_for_padded_seq2seq_labels(tmp_path):
    """Targets of 2-7 tokens (padded with -100): GA 2 x batch 2 trains as GA 1 x batch 4, and the first logged
    loss is the token mean of the step's four rows by hand (not the mean of two micro-batch means)."""
    data = rows(16, label_lengths=(2, 3, 7, 6, 4))
    model = tiny_bart()
    with torch.no_grad():
        first_four = collate(data[:4])
        by_hand = model(**first_four).loss.item()  # BART's loss: the mean over the labelled tokens
        halves = (model(**collate(data[:2])).loss.item() + model(**collate(data[2:4])).loss.item()) / 2
    assert abs(by_hand - halves) > 1e-3  # the two rules differ on these rows
    runs = {}
    for batch, ga in ((4, 1), (2, 2)):
        args = seq2seq_args(cadence, tmp_path / f"ga{ga}", per_device_train_batch_size=batch,
                            gradient_accumulation_steps=ga, train_sampling_strategy="sequential", max_steps=4)
        # BART as transformers ships it (forward(**kwargs), its own mean loss): cadence weighs each mean by its items
        trainer = Seq2SeqTrainer(tiny_bart(as_shipped=True), args, data_collator=collate, train_dataset=data)
        trainer.train()
        runs[ga] = (trainer.model.state_dict(), [h["loss"] for h in trainer.state.log_history if "loss" in h])
    assert runs[2][1][0] == pytest.approx(by_hand, rel=1e-6)
    assert runs[2][1] == pytest.approx(runs[1][1], rel=1e-6)
    for name, value in runs[1][0].items():
        assert torch.allclose(runs[2][0][name], value, atol=1e-6, rtol=0), name


class CountingGenerate:
    """Wraps model.generate, recording the options of each call."""

    def __init__(self, model):
        self.calls, self.inner = [], model.generate
        model.generate = self

    def __call__(self, **kwargs):
        self.calls.append({k: v for k, v in kwargs.items() if not torch.is_tensor(v)})
        return self.inner(**kwargs)


def test_generation_options_reach_generate_and_set_the_width(tmp_path):
    data = rows(8)
    model = tiny_bart()
    trainer = Seq2SeqTrainer(model, seq2seq_args(cadence, tmp_path, generation_max_length=24), data_collator=collate,
                             eval_dataset=data, compute_metrics=token_accuracy)
    spy = CountingGenerate(model)
    prediction = trainer.predict(data)
    assert spy.calls[-1]["max_length"] == 24 and spy.calls[-1]["num_beams"] == 2  # the arguments' defaults
    assert prediction.predictions.shape == (8, 24)  # the longest a generation can reach: one width for all batches
    assert not (prediction.predictions == -100).any() and (prediction.label_ids[:, 5:] == PAD).all()
    prediction = trainer.predict(data, max_new_tokens=3, num_beams=1)
    assert "max_length" not in spy.calls[-1] and spy.calls[-1]["max_new_tokens"] == 3 and spy.calls[-1]["num_beams"] == 1
    assert prediction.predictions.shape == (8, 20)  # the config's max_length (20), as transformers pads
    assert ((prediction.predictions != PAD).sum(1) <= 4).all()  # start token + 3 new ones
    # a dict of eval sets: each generates with the call's options (not the defaults)
    metrics = trainer.evaluate({"a": data[:4], "b": data[4:]}, num_beams=3)
    assert {"eval_a_loss", "eval_b_loss", "eval_a_token_accuracy"} <= set(metrics)
    assert [c["num_beams"] for c in spy.calls[-2:]] == [3, 3]
    # predictions not wanted: nothing is generated, the loss is the same
    with_generation = trainer.evaluate(data)["eval_loss"]
    calls = len(spy.calls)
    trainer.args.prediction_loss_only = True
    assert trainer.evaluate(data)["eval_loss"] == with_generation
    assert len(spy.calls) == calls
    trainer.args.prediction_loss_only = False
    trainer.args.predict_with_generate, trainer.compute_metrics = False, None  # logits, as the plain Trainer gives them
    assert trainer.predict(data).predictions[0].shape[-1] == VOCAB and len(spy.calls) == calls


def test_generation_config_argument(tmp_path):
    config = transformers.GenerationConfig(max_length=12, num_beams=3, pad_token_id=PAD, eos_token_id=EOS,
                                           decoder_start_token_id=EOS)
    model = tiny_bart()
    Seq2SeqTrainer(model, seq2seq_args(cadence, tmp_path, generation_config=config), data_collator=collate)
    assert model.generation_config.num_beams == 3 and model.generation_config is not config  # a copy
    config.save_pretrained(tmp_path / "gen")
    for where in (tmp_path / "gen", str(tmp_path / "gen" / "generation_config.json")):
        model = tiny_bart()
        Seq2SeqTrainer(model, seq2seq_args(cadence, tmp_path, generation_config=where), data_collator=collate)
        assert model.generation_config.max_length == 12
    with pytest.raises(ValueError, match="generation_config=.*could not be loaded"):
        Seq2SeqTrainer(tiny_bart(), seq2seq_args(cadence, tmp_path, generation_config=str(tmp_path / "missing")))
    bad = transformers.GenerationConfig(num_beams=1, length_penalty=2.0)  # a beam option without beams
    with pytest.raises(ValueError, match="generation_config is invalid"):
        Seq2SeqTrainer(tiny_bart(), seq2seq_args(cadence, tmp_path, generation_config=bad))
    d = seq2seq_args(cadence, tmp_path, generation_config=config).to_dict()
    assert d["generation_config"]["num_beams"] == 3 and json.dumps(d)


def test_bad_options_fail_at_construction(tmp_path):
    out = tmp_path / "never"
    with pytest.raises(ValueError, match=r"generation_num_beams=0 is invalid.*positive integer"):
        Seq2SeqTrainingArguments(str(out), generation_num_beams=0)
    with pytest.raises(ValueError, match=r"generation_max_length=-1 is invalid"):
        Seq2SeqTrainingArguments(str(out), generation_max_length=-1)
    with pytest.raises(ValueError, match="needs a model with a generate"):
        Seq2SeqTrainer(torch.nn.Linear(2, 2), Seq2SeqTrainingArguments(str(out), predict_with_generate=True,
                                                                       report_to="none"))
    assert not out.exists()


def test_parses_from_the_command_line_like_transformers():
    argv = ["--output_dir", "o", "--predict_with_generate", "--generation_num_beams", "3", "--generation_max_length", "40"]
    (ours,) = transformers.HfArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(argv)
    (theirs,) = transformers.HfArgumentParser(transformers.Seq2SeqTrainingArguments).parse_args_into_dataclasses(argv)
    for name in ("predict_with_generate", "generation_num_beams", "generation_max_length", "generation_config"):
        assert getattr(ours, name) == getattr(theirs, name), name


def test_bf16_generation_runs_under_autocast_like_transformers(tmp_path):
    """With bf16, transformers' evaluation runs the forward (and so generate) under accelerate's autocast; cadence
    generates under the same autocast: every forward of generate() and of the loss computes in bfloat16, and the
    tokens and loss are transformers'."""
    train, test = rows(16), rows(8, seed=5)
    results = {}
    for lib in (transformers, cadence):
        model = tiny_bart()
        trainer = lib.Seq2SeqTrainer(model, seq2seq_args(lib, tmp_path / lib.__name__, bf16=True, max_steps=2),
                                     data_collator=collate, train_dataset=train)
        trainer.train()
        dtypes = []
        hook = model.lm_head.register_forward_hook(lambda module, inputs, output: dtypes.append(output.dtype))
        results[lib.__name__] = (trainer.predict(test), dtypes)
        hook.remove()
    (ours, dtypes), (theirs, hf_dtypes) = results["cadence"], results["transformers"]
    assert set(dtypes) == set(hf_dtypes) == {torch.bfloat16} and len(dtypes) == len(hf_dtypes) > 2
    assert np.array_equal(ours.predictions, theirs.predictions)
    assert ours.metrics["test_loss"] == pytest.approx(theirs.metrics["test_loss"], abs=1e-5)


def test_bad_generation_settings_fail_before_the_first_step_and_before_predicting(tmp_path):
    """num_beams=0 in the model's generation config trained and then died at the first evaluation (ZeroDivisionError
    inside generate); predict(num_beams=-3) gave "negative dimension": each is named before anything runs."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps = []
    hook = register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: steps.append(1))
    try:
        model = tiny_bart()
        model.generation_config.num_beams = 0
        trainer = Seq2SeqTrainer(model, seq2seq_args(cadence, tmp_path / "a", generation_num_beams=None,
                                                     eval_strategy="steps", eval_steps=2),
                                 data_collator=collate, train_dataset=rows(16), eval_dataset=rows(4))
        with pytest.raises(ValueError, match=r"num_beams=0 .*model\.generation_config.*at least 1"):
            trainer.train()
        assert not steps
        model = tiny_bart()
        model.generation_config.max_new_tokens = 0  # set after construction: GenerationConfig's own check is bypassed
        trainer = Seq2SeqTrainer(model, seq2seq_args(cadence, tmp_path / "b"), data_collator=collate,
                                 train_dataset=rows(16))
        with pytest.raises(ValueError, match=r"max_new_tokens=0 .*model\.generation_config"):
            trainer.train()
        assert not steps
    finally:
        hook.remove()
    trainer = Seq2SeqTrainer(tiny_bart(), seq2seq_args(cadence, tmp_path / "c"), data_collator=collate)
    spy = CountingGenerate(trainer.model)
    with pytest.raises(ValueError, match=r"predict\(num_beams=-3\).*at least 1"):
        trainer.predict(rows(4), num_beams=-3)
    with pytest.raises(ValueError, match=r"evaluate\(max_length=0\).*at least 1"):
        trainer.evaluate(rows(4), max_length=0)
    with pytest.raises(ValueError, match=r"num_return_sequences=0"):
        trainer.predict(rows(4), num_return_sequences=0)
    with pytest.raises(ValueError, match=r"predict\(num_beams=2.5\).*whole number"):
        trainer.predict(rows(4), num_beams=2.5)
    assert not spy.calls  # refused before generating
    assert trainer.predict(rows(4), num_beams=1, max_new_tokens=2).predictions.shape[0] == 4  # good ones still run
