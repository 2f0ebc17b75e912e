"""The question-answering-style script (tests/workers/qa_example.py: a tiny BERT, and a Trainer subclass that overrides
evaluate/predict around evaluation_loop and calls self.accelerator.gather/unwrap_model in compute_loss) runs on
cadence and on transformers with only the import changed and gives the same weights, answers and metrics;
resumed it ends bit-identical to the unbroken run; on two processes (torchrun, gloo) it gives the one-process
answers and metrics, and the subclass's gathered statistic counts every process's batches."""

import json
import random

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")
from safetensors.torch import load_file  # noqa: E402

import qa_example  # noqa: E402
from example_runs import read, runs_on_both_libraries  # noqa: E402
from dist_exit import assert_finished, launch  # noqa: E402

SPEED = ("_runtime", "_per_second")
SHIFT_ONLY = {"qa_outputs.bias", "bert.encoder.layer.0.attention.self.key.bias"}
REL = 1e-4  # the same float32 model in two libraries: sums in another order differ in the last bits
WORDS = ("apple", "river", "stone", "cloud", "maple", "tiger", "lemon", "ocean", "piano", "queen", "robot", "sugar")


def write_data(path, rows, seed):
    """Which word follows the question's word in the context? (the answer is the next word)"""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(rows):
            words = rng.sample(WORDS, rng.randint(5, 9))
            k = rng.randrange(len(words) - 1)
            f.write(json.dumps({"id": f"q{seed}-{i}", "question": words[k], "context": " ".join(words),
                                "answer": words[k + 1]}) + "\n")


def argv(data, out, batch=4, ga=2):
    return ["--train_file", str(data / "train.jsonl"), "--validation_file", str(data / "valid.jsonl"),
            "--output_dir", str(out), "--do_train", "--do_eval", "--do_predict",
            "--per_device_train_batch_size", str(batch), "--gradient_accumulation_steps", str(ga),
            "--per_device_eval_batch_size", "4", "--num_train_epochs", "2", "--learning_rate", "5e-3",
            "--logging_steps", "2", "--eval_strategy", "steps", "--eval_steps", "4", "--save_steps", "4",
            "--report_to", "none", "--use_cpu", "--cache_dir", str(data / "cache"), "--seed", "5",
            "--disable_tqdm", "true",
            # directions with no true gradient (a key bias, a LayerNorm bias seen by a 2-output head) get only
            # float noise, which Adam with eps 1e-8 turns into steps of lr's size: eps 1e-6 keeps the comparisons of
            # weights meaningful (real gradients here are >= 1e-4)
            "--adam_epsilon", "1e-6"]




@pytest.fixture(scope="module")
def data(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qa_data")
    write_data(folder / "train.jsonl", 48, seed=0)  # 6 steps an epoch at a global batch of 8
    write_data(folder / "valid.jsonl", 16, seed=1)  # 4 eval batches of 4
    return folder


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory):
    return runs_on_both_libraries(tmp_path_factory.mktemp("qa"), qa_example.main, "QA_EXAMPLE_LIB", lambda out: argv(data, out))


def compare(mine, hers, rel=REL):
    assert set(mine) - {"total_flos"} == set(hers) - {"total_flos"}  # transformers drops it with progress bars off
    for key, value in hers.items():
        if not key.endswith(SPEED) and key in mine:
            assert mine[key] == pytest.approx(value, rel=rel, abs=1e-4), key


def test_same_weights_answers_and_metrics_as_transformers(runs, data):
    (cd, trainer), (hf, hf_trainer) = runs["cadence"], runs["transformers"]
    a, b = load_file(cd / "model.safetensors"), load_file(hf / "model.safetensors")
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5, rtol=0), name
    for name in ("eval_results.json", "predict_results.json", "train_results.json"):
        compare(read(cd, name), read(hf, name))
    ours, theirs = read(cd, "qa_predictions.json"), read(hf, "qa_predictions.json")
    assert ours == theirs  # the answers, the gathered statistic, the unwrapped model's class
    answers = [json.loads(line)["answer"] for line in (data / "train.jsonl").read_text().splitlines()]
    assert ours["answer_bytes_seen"] == 2 * sum(len(a) for a in answers)  # two epochs, every row once each
    assert ours["unwrapped_classes"] == ["BertForQuestionAnswering"]
    evals = [h for h in trainer.state.log_history if "eval_f1" in h]
    hf_evals = [h for h in hf_trainer.state.log_history if "eval_f1" in h]
    assert len(evals) == len(hf_evals) == 4  # steps 4, 8, 12 and the script's final evaluate()
    for mine, hers in zip(evals, hf_evals):
        for key in ("eval_loss", "eval_f1", "eval_exact_match"):
            assert mine[key] == pytest.approx(hers[key], rel=REL, abs=1e-4), key
    assert evals[-1]["eval_loss"] < evals[0]["eval_loss"]
    print(f"\n  cadence {read(cd, 'eval_results.json')}\n  transformers {read(hf, 'eval_results.json')}")


def test_resumed_run_ends_bit_identical(runs):
    full, resumed = runs["cadence"][0], runs["resumed"][0]
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    for name in ("eval_results.json", "predict_results.json"):
        unbroken, again = read(full, name), read(resumed, name)
        assert {k: v for k, v in again.items() if not k.endswith(SPEED)} == \
               {k: v for k, v in unbroken.items() if not k.endswith(SPEED)}, name
    assert read(full, "qa_predictions.json")["answers"] == read(resumed, "qa_predictions.json")["answers"]


@pytest.mark.slow
def test_two_processes_give_the_one_process_results(runs, data, tmp_path):
    one, two = runs["cadence"][0], tmp_path / "out"
    proc = launch("example_worker.py", "qa_example", *argv(data, two, batch=2, ga=2), timeout=300, cwd=tmp_path,
                  env={"QA_EXAMPLE_LIB": "cadence", "HF_DATASETS_OFFLINE": "1"})
    assert_finished(proc, 2)
    a, b = load_file(one / "model.safetensors"), load_file(two / "model.safetensors")
    for name in a:
        # float32 gradients summed in another order (an all-reduce of two halves): last bits, through 12 Adam steps.
        # A bias that shifts every position's score alike (the span head's, an attention key's) changes no softmax:
        # its gradient is float noise only, which Adam scales up (8.6e-5 measured), and it changes no output
        atol = 1e-3 if name in SHIFT_ONLY else 1e-5
        assert (a[name] - b[name]).abs().max().item() <= atol, (name, (a[name] - b[name]).abs().max().item())
    for name in ("eval_results.json", "predict_results.json"):
        compare(read(two, name), read(one, name), rel=1e-5)
    # gathered in compute_loss on each process: both processes' batches, so the one-process total
    assert read(two, "qa_predictions.json") == read(one, "qa_predictions.json")
