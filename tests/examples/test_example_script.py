"""A whole example script (tests/workers/clm_example.py, in the style of HF's language-modeling example) runs on
cadence with only the import changed, writes the files transformers writes with the same keys and values,
parses the same from argv and from a JSON file, and resumes with --resume_from_checkpoint exactly."""

import contextlib
import io
import json
import shutil

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("datasets")
yaml = pytest.importorskip("yaml")
from safetensors.torch import load_file  # noqa: E402

import clm_example  # noqa: E402

SPEED = ("_runtime", "_per_second")  # wall-clock values: only their keys are compared
# Two libraries, the same float32 model: sums of the same terms in another order (fused AdamW, loss
# reductions) differ in the last bits; 1e-4 relative is far below a real difference (one wrong label
# count per 64-token block moves the loss by 1.6%).
REL = 1e-4


def argv(data, out):
    return ["--train_file", str(data / "train.txt"), "--validation_file", str(data / "valid.txt"),
            "--output_dir", str(out), "--do_train", "--do_eval", "--per_device_train_batch_size", "8",
            "--per_device_eval_batch_size", "8", "--num_train_epochs", "2", "--learning_rate", "3e-3",
            "--warmup_steps", "2", "--logging_steps", "2", "--eval_strategy", "steps", "--eval_steps", "4",
            "--save_steps", "4", "--report_to", "none", "--use_cpu", "--n_embd", "16",
            "--cache_dir", str(data / "cache"), "--seed", "7"]


def run(monkeypatch, lib, args):
    """The script's main() in this process; returns (trainer, what it printed)."""
    monkeypatch.setenv("CLM_EXAMPLE_LIB", lib)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        trainer = clm_example.main(args)
    return trainer, printed.getvalue()


def typed(text):
    """A command-line value as JSON would hold it: numbers and booleans typed, anything else a string."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read(out, name):
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each way of running the script once: cadence from argv, transformers from argv, cadence from a JSON
    file, and both libraries resumed from checkpoint-8 of a copy of their run (16 steps in all)."""
    import pydoc_data.topics

    monkeypatch = pytest.MonkeyPatch()
    root = tmp_path_factory.mktemp("clm")
    data = root / "data"
    data.mkdir()
    text = "\n".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    (data / "train.txt").write_text(text[:4000])  # 62 blocks of 64 bytes: 8 batches a epoch
    (data / "valid.txt").write_text(text[4000:5300])  # 20 blocks
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    result = {"data": data}
    try:
        for lib in ("cadence", "transformers"):
            out = root / lib / "out"  # same folder name: the model cards are titled alike
            result[lib] = (out, *run(monkeypatch, lib, argv(data, out)))
            resumed = root / f"{lib}_resumed" / "out"
            resumed.mkdir(parents=True)
            shutil.copytree(out / "checkpoint-8", resumed / "checkpoint-8")
            args = argv(data, resumed) + ["--resume_from_checkpoint", str(resumed / "checkpoint-8")]
            result[f"{lib}_resumed"] = (resumed, *run(monkeypatch, lib, args))
        # the same options as a JSON file, with JSON's types (numbers, booleans), as people write them
        flags = [a for a in argv(data, root / "json" / "out") if a not in ("--do_train", "--do_eval", "--use_cpu")]
        config = {"do_train": True, "do_eval": True, "use_cpu": True}
        config.update({flag[2:]: typed(value) for flag, value in zip(flags[::2], flags[1::2])})
        (root / "args.json").write_text(json.dumps(config))
        result["json"] = (root / "json" / "out", *run(monkeypatch, "cadence", [str(root / "args.json")]))
    finally:
        monkeypatch.undo()
    return result


def test_files_written_like_transformers(runs):
    cd, hf = runs["cadence"][0], runs["transformers"][0]
    expected = {"README.md", "all_results.json", "train_results.json", "eval_results.json", "trainer_state.json",
                "model.safetensors", "config.json", "training_args.bin"}
    for out in (cd, hf):
        assert expected <= {p.name for p in out.iterdir()}, out
        assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-12", "checkpoint-16", "checkpoint-4",
                                                                    "checkpoint-8"]
    for name in ("train_results.json", "eval_results.json", "all_results.json"):
        ours, theirs = read(cd, name), read(hf, name)
        assert set(ours) == set(theirs), name
        for key, value in theirs.items():
            if key.endswith(SPEED):
                continue
            assert ours[key] == pytest.approx(value, rel=REL), (name, key)
    assert (cd / "all_results.json").read_text().startswith('{\n    "epoch"')  # indent 4, sorted keys
    eval_results = read(cd, "eval_results.json")
    assert eval_results["perplexity"] == pytest.approx(2.718281828459045 ** eval_results["eval_loss"], rel=1e-12)
    assert eval_results["eval_samples"] == 20 and read(cd, "train_results.json")["train_samples"] == 62
    evals = [h["eval_loss"] for h in read(cd, "trainer_state.json")["log_history"] if "eval_loss" in h]
    assert evals[-1] < evals[0] - 0.2  # it learned


def test_trainer_state_and_log_history_like_transformers(runs):
    ours, theirs = read(runs["cadence"][0], "trainer_state.json"), read(runs["transformers"][0], "trainer_state.json")
    assert set(ours) == set(theirs)
    for key in ("global_step", "max_steps", "num_train_epochs", "logging_steps", "eval_steps", "save_steps",
                "train_batch_size", "epoch"):
        assert ours[key] == theirs[key], key
    assert ours["total_flos"] == pytest.approx(theirs["total_flos"], rel=1e-9)
    assert len(ours["log_history"]) == len(theirs["log_history"]) == 8 + 4 + 1
    for mine, hers in zip(ours["log_history"], theirs["log_history"]):
        assert set(mine) == set(hers)
        for key, value in hers.items():
            if not key.endswith(SPEED):
                assert mine[key] == pytest.approx(value, rel=REL), key
    # the final model is the same model
    a, b = load_file(runs["cadence"][0] / "model.safetensors"), load_file(runs["transformers"][0] / "model.safetensors")
    assert set(a) <= set(b)  # transformers may also store the tied lm_head
    for name in a:
        assert torch.allclose(a[name], b[name], atol=2e-4, rtol=1e-3), name


def test_log_metrics_prints_transformers_table(runs):
    def table(stdout, split):
        lines = stdout[stdout.index(f"***** {split} metrics *****"):].splitlines()[1:]
        rows = [line for line in lines[: next((i for i, l in enumerate(lines) if not l.startswith("  ")), len(lines))]]
        return {line.split(" = ")[0].strip(): line.split(" = ")[1].strip() for line in rows}

    for split in ("train", "eval"):
        ours, theirs = table(runs["cadence"][2], split), table(runs["transformers"][2], split)
        assert list(ours) == list(theirs)  # same keys, same (sorted) order
        for key, value in theirs.items():
            if not key.endswith(SPEED) and key != "total_flos":
                assert float(ours[key]) == pytest.approx(float(value), rel=REL, abs=1e-4), key
        assert ":" in ours[f"{split}_runtime"]
    assert table(runs["cadence"][2], "train")["total_flos"].endswith("GF")


def test_model_card_like_transformers(runs):
    def parts(out):
        text = (out / "README.md").read_text()
        _, header, body = text.split("---\n", 2)
        return yaml.safe_load(header), body

    (ours, body), (theirs, hf_body) = parts(runs["cadence"][0]), parts(runs["transformers"][0])
    assert ours["tags"] == theirs["tags"] == ["generated_from_trainer"]
    assert ours["model-index"] == theirs["model-index"] == [{"name": "out", "results": []}]

    def section(text, title, end):
        return text[text.index(title): text.index(end)]

    hp = "### Training hyperparameters"
    # transformers writes the optimizer enum's repr ("OptimizerNames.ADAMW_TORCH_FUSED"); cadence its name
    hf_body = hf_body.replace("OptimizerNames.ADAMW_TORCH_FUSED", "adamw_torch_fused")
    assert section(body, hp, "### Training results") == section(hf_body, hp, "### Training results")
    assert "This model was trained from scratch on the local text files dataset." in body
    # transformers reads the empty config._name_or_path of a model built from a config as a base model name
    assert "This model is a fine-tuned version of [](https://huggingface.co/) on the local text files" in hf_body
    ours_rows = section(body, "| Training Loss", "### Framework").strip().splitlines()
    hf_rows = section(hf_body, "| Training Loss", "### Framework").strip().splitlines()
    assert ours_rows[:2] == hf_rows[:2] and len(ours_rows) == len(hf_rows) == 2 + 4
    for mine, hers in zip(ours_rows[2:], hf_rows[2:]):
        cells = [c.strip() for c in mine.strip("|").split("|")], [c.strip() for c in hers.strip("|").split("|")]
        assert cells[0][1:3] == cells[1][1:3]  # epoch, step
        assert [float(c) for c in cells[0][::3]] == pytest.approx([float(c) for c in cells[1][::3]], abs=2e-4)


def test_json_file_parses_like_argv(runs):
    argv_state, json_state = read(runs["cadence"][0], "trainer_state.json"), read(runs["json"][0], "trainer_state.json")
    losses = [[h.get("loss"), h.get("eval_loss")] for h in argv_state["log_history"]]
    assert losses == [[h.get("loss"), h.get("eval_loss")] for h in json_state["log_history"]]  # cadence twice: exact
    args = runs["json"][1].args
    assert (args.learning_rate, args.eval_steps, args.do_train, args.use_cpu) == (3e-3, 4, True, True)


def test_resume_from_checkpoint_continues_exactly(runs):
    full, resumed = runs["cadence"][0], runs["cadence_resumed"][0]
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit-identical to the unbroken run
    for name in ("train_results.json", "eval_results.json"):
        unbroken, again = read(full, name), read(resumed, name)
        for key, value in unbroken.items():
            if not key.endswith(SPEED):
                assert again[key] == value, (name, key)  # train_loss too: averaged over all 16 steps
    history = [{k: v for k, v in h.items() if not k.endswith(SPEED)} for h in read(full, "trainer_state.json")["log_history"]]
    again = [{k: v for k, v in h.items() if not k.endswith(SPEED)} for h in read(resumed, "trainer_state.json")["log_history"]]
    assert again == history
    # transformers' resumed train_loss averages the 8 resumed steps only (a deliberate difference, README)
    hf_full = read(runs["transformers"][0], "train_results.json")["train_loss"]
    hf_resumed = read(runs["transformers_resumed"][0], "train_results.json")["train_loss"]
    second_half = [h["loss"] for h in read(full, "trainer_state.json")["log_history"] if "loss" in h and h["step"] > 8]
    assert hf_resumed == pytest.approx(sum(second_half) / len(second_half), rel=REL)
    assert abs(hf_resumed - hf_full) > 0.05
    print(f"\ntrain_loss unbroken {hf_full:.4f}; resumed at step 8: cadence {read(resumed, 'train_results.json')['train_loss']:.4f}, "
          f"transformers {hf_resumed:.4f}")


@pytest.mark.slow
def test_two_processes_run_the_script_like_one(runs, tmp_path):
    """torchrun with 2 processes (half the per-device batch): main_process_first around datasets.map, files
    written once by the main process, and the same numbers as the one-process run."""
    from dist_exit import launch

    out = tmp_path / "out"
    args = argv(runs["data"], out)
    args[args.index("--per_device_train_batch_size") + 1] = "4"
    proc = launch("clm_example.py", *args, "--ddp_backend", "gloo", timeout=600,
                  env={"HF_DATASETS_OFFLINE": "1", "CLM_EXAMPLE_LIB": "cadence"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("***** train metrics *****") == 1  # log_metrics prints on the main process only
    one = runs["cadence"][0]
    for name in ("train_results.json", "eval_results.json"):
        two_procs, one_proc = read(out, name), read(one, name)
        assert set(two_procs) == set(one_proc)
        for key in ("train_loss", "eval_loss", "perplexity", "epoch", "train_samples", "eval_samples"):
            if key in one_proc:
                # float32 sums reduced over 2 processes in another order than on one
                assert two_procs[key] == pytest.approx(one_proc[key], rel=1e-5), (name, key)
    card = (out / "README.md").read_text()
    assert "- distributed_type: multi-GPU\n- num_devices: 2\n" in card and "- total_train_batch_size: 8\n" in card
