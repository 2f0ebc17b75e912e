"""The summarization-style script (tests/workers/summarization_example.py: a tiny BART, Seq2SeqTrainer with
predict_with_generate and beam search) runs on cadence and on transformers with only the import changed and
gives the same weights, generated text and metrics; resumed from a checkpoint it ends bit-identical to the
unbroken run; on two processes (torchrun, gloo) it gives the one-process predictions and metrics."""

import json
import random

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")
from safetensors.torch import load_file  # noqa: E402

import summarization_example  # noqa: E402
from example_runs import read, runs_on_both_libraries  # noqa: E402
from dist_exit import assert_finished, launch  # noqa: E402

SPEED = ("_runtime", "_per_second")
# the same float32 model in two libraries: sums in another order differ in the last bits
REL = 1e-4
SHIFT_ONLY = {"model.encoder.layers.0.self_attn.k_proj.bias", "model.decoder.layers.0.self_attn.k_proj.bias",
              "model.decoder.layers.0.encoder_attn.k_proj.bias"}
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean", "piano", "queen", "robot", "sugar",
         "violet", "wagon", "yellow", "zebra", "amber", "bison", "candle", "delta")


def write_data(folder, rows, seed):
    """Documents of 6-12 words; the summary is the initials of the first 6 (always 6 bytes + eos: equal
    label counts per row, so transformers' per-batch means and cadence's item mean are one number)."""
    rng = random.Random(seed)
    with open(folder, "w") as f:
        for _ in range(rows):
            words = [rng.choice(WORDS) for _ in range(rng.randint(6, 12))]
            f.write(json.dumps({"document": " ".join(words), "summary": "".join(w[0] for w in words[:6])}) + "\n")


def argv(data, out, batch=4, ga=2):
    return ["--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "valid.jsonl"),
            "--output_dir", str(out), "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
            "--generation_num_beams", "2", "--generation_max_length", "10",
            "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(ga),
            "--per_device_eval_batch_size", "4", "--num_train_epochs", "2", "--learning_rate", "1e-2",
            "--warmup_steps", "2", "--logging_steps", "2", "--eval_strategy", "steps", "--eval_steps", "4",
            "--save_steps", "4", "--report_to", "none", "--use_cpu", "--d_model", "32",
            "--cache_dir", str(data / "cache"), "--seed", "11", "--disable_tqdm", "true",
            # directions with no true gradient (a key bias, a LayerNorm bias seen by a 2-output head) get only
            # float noise, which Adam with eps 1e-8 turns into steps of lr's size: eps 1e-6 keeps the comparisons of
            # weights meaningful (real gradients here are >= 1e-4)
            "--adam_epsilon", "1e-6"]



def launch_two(args, tmp):
    proc = launch("example_worker.py", "summarization_example", *args, timeout=300, cwd=tmp,
                  env={"SEQ2SEQ_EXAMPLE_LIB": "cadence", "HF_DATASETS_OFFLINE": "1"})
    assert_finished(proc, 2)



@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("seq2seq_data")
    write_data(folder / "train.jsonl", 48, seed=0)  # 6 steps an epoch at a global batch of 8: 12 in all
    write_data(folder / "valid.jsonl", 16, seed=1)  # 4 eval batches of 4
    return folder


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    """The script on cadence and on transformers, and on cadence resumed from checkpoint-8 of a copy of its run."""
    return runs_on_both_libraries(tmp_path_factory.mktemp("seq2seq"), summarization_example.main, "SEQ2SEQ_EXAMPLE_LIB", lambda out: argv(data, out))


def test_same_weights_generations_and_metrics_as_transformers(runs):
    (cd, cd_trainer), (hf, _) = runs["cadence"], runs["transformers"]
    a, b = load_file(cd / "model.safetensors"), load_file(hf / "model.safetensors")
    assert set(a) <= set(b)  # transformers may store tied embeddings once more
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), name
    # token for token, padded alike (pad token to the generation width: no -100 anywhere)
    ours, theirs = np.load(cd / "predicted_ids.npy"), np.load(hf / "predicted_ids.npy")
    assert ours.shape == theirs.shape == (16, 20) and (ours == theirs).all() and not (ours == -100).any()
    assert (cd / "generated_predictions.txt").read_text() == (hf / "generated_predictions.txt").read_text()
    for name in ("eval_results.json", "predict_results.json", "train_results.json"):
        mine, hers = read(cd, name), read(hf, name)
        # with progress bars off transformers' printer callback deletes total_flos (README, smaller differences)
        assert set(mine) - {"total_flos"} == set(hers), name
        for key, value in hers.items():
            if not key.endswith(SPEED):
                assert mine[key] == pytest.approx(value, rel=REL, abs=1e-4), (name, key)
    evals = [h for h in read(cd, "trainer_state.json")["log_history"] if "eval_loss" in h]
    hf_evals = [h for h in read(hf, "trainer_state.json")["log_history"] if "eval_loss" in h]
    assert len(evals) == len(hf_evals) == 3
    for mine, hers in zip(evals, hf_evals):
        for key in ("eval_loss", "eval_rouge1", "eval_exact_match", "eval_gen_len"):
            assert mine[key] == pytest.approx(hers[key], rel=REL, abs=1e-4), key
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"] - 0.3  # it learned
    print(f"\n  cadence eval {read(cd, 'eval_results.json')}\n  transformers eval {read(hf, 'eval_results.json')}")


def test_resumed_run_ends_bit_identical(runs):
    full, resumed = runs["cadence"][0], runs["resumed"][0]
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (np.load(full / "predicted_ids.npy") == np.load(resumed / "predicted_ids.npy")).all()
    for name in ("eval_results.json", "predict_results.json", "train_results.json"):
        unbroken, again = read(full, name), read(resumed, name)
        assert {k: v for k, v in again.items() if not k.endswith(SPEED)} == \
               {k: v for k, v in unbroken.items() if not k.endswith(SPEED)}, name


@pytest.mark.slow
def test_two_processes_give_the_one_process_results(runs, data, tmp_path):
    one, two = runs["cadence"][0], tmp_path / "out"
    launch_two(argv(data, two, batch=2, ga=2), tmp_path)  # 2 processes x 2 x GA 2: the same global batch of 8
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in a:
        # float32 gradients summed in another order (an all-reduce of two halves): last bits, through 12 Adam steps.
        # A bias that shifts every position's score alike (the span head's, an attention key's) changes no softmax:
        # its gradient is float noise only, which Adam scales up (8.6e-5 measured), and it changes no output
        atol = 1e-3 if name in SHIFT_ONLY else 1e-5
        assert (a[name] - b[name]).abs().max().item() <= atol, (name, (a[name] - b[name]).abs().max().item())
    # generated on each process, padded to one width, gathered in dataset order
    assert (np.load(one / "predicted_ids.npy") == np.load(two / "predicted_ids.npy")).all()
    for name in ("eval_results.json", "predict_results.json"):
        mine, other = read(one, name), read(two, name)
        for key, value in mine.items():
            if not key.endswith(SPEED):
                assert other[key] == pytest.approx(value, rel=1e-5), (name, key)
