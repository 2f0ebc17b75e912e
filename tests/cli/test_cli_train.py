"""cadence train end to end on tiny local files: a text file (causal LM, from scratch and fine-tuned)
and a CSV (sequence classification); its errors for a missing file or column come before any model load.

The model folders are made here: a tiny GPT-2 config and a word-level tokenizer trained on the test
text with `tokenizers` (nothing downloaded). The reference for the reported eval loss is the saved
model reloaded with transformers and run by hand over the same validation rows."""

import json
import math
import os

import pytest
import torch

from cadence.cli import main
from cadence.cli_train import load_data, parse, run_train
from repo_paths import REPO

transformers = pytest.importorskip("transformers")
pytest.importorskip("datasets")

WORDS = "the a cat dog sat ran on under mat log big small red blue".split()


def sentences(n, seed):
    g = torch.Generator().manual_seed(seed)
    pick = lambda: WORDS[int(torch.randint(len(WORDS), (1,), generator=g))]  # noqa: E731
    return [" ".join(pick() for _ in range(6)) for _ in range(n)]


@pytest.fixture
def model_folder(tmp_path):
    """config.json (GPT-2, 2 layers, 32 wide) and a word-level tokenizer; no weights: a new model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import GPT2Config, PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.train_from_iterator(sentences(50, 0), trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")
    folder = tmp_path / "tiny-gpt2"
    tokenizer.save_pretrained(folder)
    GPT2Config(vocab_size=len(tokenizer), n_positions=64, n_embd=32, n_layer=2, n_head=2,
               pad_token_id=tokenizer.pad_token_id).save_pretrained(folder)
    return folder


@pytest.fixture
def text_files(tmp_path):
    train, valid = tmp_path / "train.txt", tmp_path / "valid.txt"
    train.write_text("\n".join(sentences(40, 1)) + "\n")
    valid.write_text("\n".join(sentences(10, 2)) + "\n")
    return str(train), str(valid)


@pytest.fixture
def csv_files(tmp_path):
    import csv

    paths = []
    for name, n, seed in (("train.csv", 32, 3), ("valid.csv", 8, 4)):
        path = tmp_path / name
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "topic"])
            for s in sentences(n, seed):  # the class is whether a cat is mentioned
                writer.writerow([s, "cats" if "cat" in s.split() else "other"])
        paths.append(str(path))
    return paths


COMMON = ["--max_steps", "6", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--logging_steps", "1",
          "--save_steps", "3", "--use_cpu", "--disable_tqdm", "true", "--seed", "0"]


def reloaded_eval_loss(out_dir, rows, causal):
    """The item-weighted mean loss of the saved model over ``rows``, computed with transformers directly."""
    auto = transformers.AutoModelForCausalLM if causal else transformers.AutoModelForSequenceClassification
    model = auto.from_pretrained(out_dir).eval()
    total, items = 0.0, 0
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([row["input_ids"]])
            loss = model(input_ids=ids, labels=ids if causal else torch.tensor([row["labels"]])).loss
            n = ids.shape[1] - 1 if causal else 1  # a causal-LM row predicts all but its first token
            total, items = total + loss.item() * n, items + n
    return total / items


def test_train_causal_lm_from_scratch_on_a_text_file(tmp_path, model_folder, text_files, capsys):
    out = str(tmp_path / "run")
    train, valid = text_files
    code = main(["train", "--model", str(model_folder), "--train_file", train, "--validation_file", valid,
                 "--block_size", "16", "--output_dir", out, *COMMON])
    assert code == 0
    printed = capsys.readouterr().out
    assert "from scratch" in printed and f"cadence plot {os.path.realpath(out)}" in printed
    for name in ("model.safetensors", "config.json", "tokenizer.json", "all_results.json", "log_history.jsonl",
                 "trainer_state.json", "checkpoint-6"):
        assert os.path.exists(os.path.join(out, name)), name
    metrics = json.load(open(os.path.join(out, "all_results.json")))
    assert metrics["train_loss"] < math.log(len(WORDS) + 3)  # it learned something over uniform guessing
    # the reported eval loss is the saved model's over the validation blocks (16 tokens each, 60 tokens -> 3)
    from cadence.cli_train import load_model, tokenize, TrainArguments

    script = TrainArguments(model=str(model_folder), train_file=train, validation_file=valid, block_size=16)
    _, tokenizer, _ = load_model(script, None)
    blocks = tokenize(load_data(script), script, tokenizer, 16, None)["validation"]
    assert len(blocks) == 3 and all(len(b["input_ids"]) == 16 for b in blocks)
    # float32 forward passes in two orders of summation: 1e-5 relative
    assert metrics["eval_loss"] == pytest.approx(reloaded_eval_loss(out, blocks, causal=True), rel=1e-5)


@pytest.mark.slow
def test_train_fine_tunes_a_folder_with_weights_and_a_model_type_from_scratch(tmp_path, model_folder, text_files, capsys):
    train, valid = text_files
    first = str(tmp_path / "first")
    assert main(["train", "--model", str(model_folder), "--train_file", train, "--block_size", "16",
                 "--output_dir", first, *COMMON]) == 0
    second = str(tmp_path / "second")  # the first run's output folder has weights: fine-tuned from them
    assert main(["train", "--model", first, "--train_file", train, "--block_size", "16", "--output_dir", second,
                 *COMMON]) == 0
    assert "fine-tuned" in capsys.readouterr().out
    third = str(tmp_path / "third")  # a transformers model type, made small, with the tokenizer of the folder
    assert main(["train", "--model", "gpt2", "--tokenizer", str(model_folder), "--config_overrides",
                 "n_layer=1,n_embd=16,n_head=2,n_positions=32", "--train_file", train, "--block_size", "16",
                 "--output_dir", third, *COMMON]) == 0
    config = json.load(open(os.path.join(third, "config.json")))
    assert (config["n_layer"], config["n_embd"], config["vocab_size"]) == (1, 16, len(WORDS) + 3)


def test_train_sequence_classification_on_a_csv_from_a_yaml_config(tmp_path, model_folder, csv_files):
    train, valid = csv_files
    out = str(tmp_path / "run")
    config = tmp_path / "run.yaml"
    config.write_text(f"""model: {model_folder}
task: sequence-classification
train_file: {train}
validation_file: {valid}
text_column: sentence
label_column: topic
block_size: 12
output_dir: {out}
max_steps: 6
per_device_train_batch_size: 4
learning_rate: 0.01
use_cpu: true
disable_tqdm: true
save_strategy: "no"
""")
    assert main(["train", str(config)]) == 0
    saved = json.load(open(os.path.join(out, "config.json")))
    assert saved["id2label"] == {"0": "cats", "1": "other"}  # sorted class names
    metrics = json.load(open(os.path.join(out, "all_results.json")))
    from cadence.cli_train import TrainArguments, load_model, tokenize

    script = TrainArguments(model=str(model_folder), train_file=train, validation_file=valid, text_column="sentence",
                            label_column="topic", task="sequence-classification")
    _, tokenizer, _ = load_model(script, ["cats", "other"])
    rows = tokenize(load_data(script), script, tokenizer, 12, ["cats", "other"])["validation"]
    # eval batches are padded; GPT-2 classifies from the last real token, so padding changes nothing: 1e-5
    assert metrics["eval_loss"] == pytest.approx(reloaded_eval_loss(out, rows, causal=False), rel=1e-5)


@pytest.mark.parametrize("flags, message", [
    (["--train_file", "{tmp}/nope.txt"], "--train_file='{tmp}/nope.txt': no such file"),
    (["--train_file", "{tmp}/data.xlsx"], "unknown file type '.xlsx'"),
    (["--train_file", "{csv}", "--text_column", "body"], "--text_column='body' is not a column of --train_file='{csv}' (its columns: sentence, topic)"),
    (["--train_file", "{csv}", "--text_column", "sentence", "--task", "sequence-classification", "--label_column", "y"],
     "--label_column='y' is not a column"),
    (["--train_file", "{csv}", "--text_column", "sentence", "--validation_file", "{tmp}/missing.csv"],
     "--validation_file='{tmp}/missing.csv': no such file"),
])
def test_train_errors_name_the_file_and_column_before_any_model_load(tmp_path, csv_files, flags, message, capsys):
    (tmp_path / "data.xlsx").write_text("x")
    fill = lambda s: s.format(tmp=tmp_path, csv=csv_files[0])  # noqa: E731
    # --model names nothing that exists: the data error must come first
    argv = ["train", "--model", "no-model", "--output_dir", str(tmp_path / "o"), *map(fill, flags)]
    assert main(argv) == 2
    assert fill(message) in capsys.readouterr().err
    with pytest.raises(ValueError):
        run_train(argv[1:])


@pytest.mark.parametrize("model, tokenizer, message", [
    ("no-such-org/no-such-model", None, ["--model='no-such-org/no-such-model'", "not a local folder",
                                         "HF_HUB_OFFLINE=1", "pass a model folder"]),
    ("{tmp}/no-model", None, ["--model='{tmp}/no-model': no such folder ({tmp}/no-model)", "pass the folder"]),
    ("./nosuch", None, ["--model='./nosuch': no such folder ({tmp}/nosuch)"]),
    ("{folder}", "../nosuch", ["--tokenizer='../nosuch': no such folder ({tmp}/../nosuch)"]),
    ("{tmp}/empty", None, ["--model='{tmp}/empty'", "is a folder without config.json"]),
    ("{folder}", "no-such-org/no-tokenizer", ["--tokenizer='no-such-org/no-tokenizer'", "HF_HUB_OFFLINE=1"]),
])
def test_train_model_or_tokenizer_that_cannot_be_loaded_is_a_one_line_error(tmp_path, model_folder, text_files, capsys,
                                                                           monkeypatch, model, tokenizer, message):
    """Offline, a name the Hub cache does not have (or a folder that is not there) is exit 2 with a message naming
    the flag and the value, as argparse reports a bad flag: no OSError traceback from transformers."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read when huggingface_hub was imported
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)  # relative folders are looked for here
    fill = lambda s: s.format(tmp=tmp_path, folder=model_folder)  # noqa: E731
    argv = ["train", "--model", fill(model), "--train_file", text_files[0], "--output_dir", str(tmp_path / "o")]
    argv += ["--tokenizer", tokenizer] if tokenizer else []
    assert main(argv) == 2
    err = capsys.readouterr().err  # also holds datasets' progress bars
    errors = [line for line in err.splitlines() if line.startswith("cadence train: error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    for piece in message:
        assert fill(piece) in errors[0], errors[0]
    assert not (tmp_path / "o").exists()


def test_train_help_lists_every_flag_the_parser_takes():
    """``cadence train --help`` is built without transformers (cli_train.help_parser): it shows exactly the flags the
    HfArgumentParser that parses takes, with the same metavars and choices."""
    from cadence.cli_train import TrainArguments, _parser_class, help_parser
    from cadence.training_args import TrainingArguments

    def flags(parser):
        return {(tuple(action.option_strings), action.nargs, tuple(action.choices or ()))
                for action in parser._actions if action.option_strings}

    parsing = _parser_class()((TrainArguments, TrainingArguments), allow_abbrev=False)
    assert flags(help_parser()) == flags(parsing)


def test_train_flags_reach_training_arguments(tmp_path):
    script, args = parse(["--model", "m", "--train_file", "t.txt", "--output_dir", str(tmp_path), "--num_train_epochs", "2",
                          "--eval_strategy", "steps", "--eval_steps", "5"])
    assert (script.model, script.task, script.text_column) == ("m", "causal-lm", "text")
    assert args.num_train_epochs == 2 and args.eval_steps == 5
    assert args.report_to == ["jsonl"]  # cadence train keeps a history for cadence plot by default


@pytest.mark.slow
def test_train_stopped_by_sigterm_exits_143_keeps_its_checkpoint_and_writes_no_final_model(tmp_path, model_folder, text_files):
    """A scheduler's SIGTERM with --enable_jit_checkpoint: checkpoint-N is saved, the exit status is 128 + 15 (so a
    requeueing scheduler starts the job again), and the partly trained model is not written as the final one;
    the requeued command with --resume_from_checkpoint true continues from checkpoint-N."""
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "run"
    flags = ["--model", str(model_folder), "--train_file", text_files[0], "--block_size", "16", "--output_dir", str(out),
             "--per_device_train_batch_size", "4", "--logging_steps", "1", "--save_strategy", "no", "--use_cpu",
             "--disable_tqdm", "true", "--seed", "0", "--enable_jit_checkpoint"]
    src = os.path.join(REPO, "src")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": src}
    proc = subprocess.Popen([sys.executable, "-m", "cadence", "train", *flags, "--max_steps", "1000000"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    history, deadline = out / "log_history.jsonl", time.monotonic() + 240
    while not (history.is_file() and '"loss"' in history.read_text()):  # training has begun (rows reach it within 1 s)
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    checkpoints = [name for name in os.listdir(out) if name.startswith("checkpoint-")]
    assert len(checkpoints) == 1 and sorted(os.listdir(out)) == [checkpoints[0], "log_history.jsonl"]  # nothing final
    step = int(checkpoints[0].split("-")[1])
    assert f"interrupted by SIGTERM at step {step}: {checkpoints[0]} is saved" in err and "Traceback" not in err
    # the requeued job: `true` is the newest checkpoint (not a folder named "true"); two more steps, then final outputs
    assert main(["train", *flags, "--max_steps", str(step + 2), "--resume_from_checkpoint", "true"]) == 0
    state = json.load(open(out / "trainer_state.json"))
    assert state["global_step"] == step + 2 and state["log_history"][0]["step"] == 1  # the interrupted run's rows too
    assert (out / "model.safetensors").is_file() and (out / "all_results.json").is_file()


@pytest.mark.parametrize("value, expected", [(None, None), ("true", True), ("True", True), ("1", True), ("yes", True),
                                             ("false", None), ("0", None), ("ckpt", "ckpt")])
def test_resume_from_checkpoint_words_mean_what_hf_argument_parser_bools_mean(value, expected):
    from cadence.cli_train import resume_argument

    assert resume_argument(value) == expected


def test_a_yaml_config_reads_text_values_as_the_flags_do(tmp_path):
    """YAML reads 1e-3 as text (its floats need a dot) and "no" in quotes as text: both mean what the flag means."""
    config = tmp_path / "run.yaml"
    config.write_text(f'model: m\ntrain_file: t.txt\noutput_dir: {tmp_path}\nlearning_rate: 1e-3\nbf16: "no"\n'
                      'overwrite_output_dir: "false"\nseed: "7"\n')
    _, from_file = parse([str(config)])
    _, from_flags = parse(["--model", "m", "--train_file", "t.txt", "--output_dir", str(tmp_path), "--learning_rate",
                           "1e-3", "--bf16", "no", "--overwrite_output_dir", "false", "--seed", "7"])
    assert (from_file.learning_rate, from_file.bf16, from_file.overwrite_output_dir, from_file.seed) == (1e-3, False, False, 7)
    assert from_file.to_dict() == from_flags.to_dict()


def test_resume_from_checkpoint_true_continues_from_the_newest_checkpoint(tmp_path, model_folder, text_files):
    out = str(tmp_path / "run")
    flags = ["train", "--model", str(model_folder), "--train_file", text_files[0], "--block_size", "16",
             "--output_dir", out, *COMMON[2:]]  # COMMON without its --max_steps
    assert main([*flags, "--max_steps", "3"]) == 0  # saves checkpoint-3 (save_steps 3)
    first = json.load(open(os.path.join(out, "trainer_state.json")))["log_history"]
    assert main([*flags, "--max_steps", "5", "--resume_from_checkpoint", "true"]) == 0
    history = json.load(open(os.path.join(out, "trainer_state.json")))["log_history"]
    assert [h["step"] for h in history if "loss" in h] == [1, 2, 3, 4, 5]  # steps 1-3 come from checkpoint-3, 4-5 were trained now
    assert [h["loss"] for h in history[:3]] == [h["loss"] for h in first[:3]]
