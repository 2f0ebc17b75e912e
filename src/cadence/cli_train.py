"""``cadence train``: train a transformers model on local text files, no script needed.

Flags are every ``TrainingArguments`` field (through transformers' ``HfArgumentParser``) plus
``TrainArguments`` below; or one JSON/YAML file holding both (``cadence train run.yaml``).

The order matters: the data files and columns are read and checked first, so a wrong path or column
is an error naming it before any model is loaded; then the tokenizer and model; then the texts are
tokenized (causal LM: concatenated and cut into ``block_size`` blocks; classification: truncated to
``block_size``), and the ``Trainer`` trains, evaluates on ``--validation_file`` and saves.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """``--help``: the description's examples as written, each flag with its default (HfArgumentParser's own)."""


TASKS = ("causal-lm", "sequence-classification")
# file extension -> the datasets builder that reads it
BUILDERS = {".txt": "text", ".csv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


@dataclass
class TrainArguments:
    """What ``cadence train`` needs besides ``TrainingArguments``."""

    model: str = field(metadata={"help": (
        "A local model folder (with weights: fine-tuned; with only config.json and a tokenizer: trained from "
        "scratch), a transformers model type such as 'gpt2' or 'bert' (from scratch, with --tokenizer), or a Hub id."
    )})
    train_file: str = field(metadata={"help": "Training data: .txt (one text per line), .csv, .json/.jsonl or .parquet."})
    task: str = field(default="causal-lm", metadata={"help": "What to train.", "choices": list(TASKS)})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, same formats."})
    text_column: str = field(default="text", metadata={"help": "The column holding the text (a .txt file's is 'text')."})
    label_column: str = field(default="label", metadata={"help": "The column holding the class (sequence-classification)."})
    block_size: int | None = field(default=None, metadata={"help": (
        "Tokens per training row: the causal-LM block length, the classification truncation length. "
        "Default: the model's maximum length, at most 1024."
    )})
    tokenizer: str | None = field(default=None, metadata={"help": "Tokenizer folder or Hub id (default: --model)."})
    config_overrides: str | None = field(default=None, metadata={"help": (
        "For a from-scratch model: config values to change, as 'n_layer=2,n_embd=64'."
    )})

    def __post_init__(self):
        # checked while parsing: before any file, model or output_dir is touched
        for flag, value in (("--model", self.model), ("--tokenizer", self.tokenizer)):
            if value is not None and _local_path(value) and not Path(value).exists():
                raise ValueError(
                    f"{flag}={value!r}: no such folder ({Path(value).absolute()}); pass the folder a model was "
                    "saved to (save_pretrained), a model type such as 'gpt2', or a Hub id such as 'openai-community/gpt2'"
                )
        if self.block_size is not None and not (isinstance(self.block_size, int) and self.block_size >= 1):
            raise ValueError(
                f"--block_size={self.block_size!r} is invalid: it must be a number of tokens >= 1; leave it out for "
                "the model's maximum length"
            )
        if self.config_overrides is not None:
            pieces = self.config_overrides.split(",")
            bad = next((p for p in pieces if "=" not in p or not p.partition("=")[0].strip()), None)
            if bad is not None:
                raise ValueError(
                    f"--config_overrides={self.config_overrides!r} is invalid: {bad!r} is not key=value; write "
                    "'n_layer=2,n_embd=64'"
                )


def _local_path(value: str) -> bool:
    """Whether ``value`` can only be a local path: it starts with ``.``, ``/`` or ``~``, or has two separators (a Hub
    id is ``name`` or ``owner/name``, and never starts with those)."""
    return value.startswith((".", "/", "~", os.sep)) or os.path.isabs(value) or value.replace(os.sep, "/").count("/") >= 2


def parse(argv: list[str]) -> tuple[TrainArguments, Any]:
    """``(TrainArguments, TrainingArguments)`` from flags or from one JSON/YAML file.

    ``report_to`` defaults to ``"jsonl"`` here, so every run leaves ``log_history.jsonl`` for ``cadence plot``.
    """
    from .training_args import TrainingArguments

    parser = _parser_class()((TrainArguments, TrainingArguments), prog="cadence train", usage=USAGE,
                             description=DESCRIPTION, formatter_class=_HelpFormatter, allow_abbrev=False)
    if len(argv) == 1 and Path(argv[0]).suffix in (".json", ".yaml", ".yml"):
        config = _read_config(Path(argv[0]))
        config.setdefault("report_to", "jsonl")
        missing = [f.name for f in fields(TrainArguments) if f.default is MISSING and f.name not in config]
        if missing:  # the dataclass would raise a TypeError naming no file
            raise ValueError(f"config file {argv[0]!r} has no {', '.join(map(repr, missing))}: add "
                             + ", ".join(f"'{name}: ...'" for name in missing))
        try:
            return tuple(parser.parse_dict(config))
        except ValueError as error:  # the message names the key and the value; say which file held it
            raise ValueError(f"config file {argv[0]!r}: {error}") from None
    parser.set_defaults(report_to="jsonl")
    _, unknown = parser.parse_known_args(argv)  # before any dataclass is built (and warns about its fields)
    if unknown:  # transformers' ValueError would name no flag it meant
        parser.error(_unrecognized(parser, unknown))
    return tuple(parser.parse_args_into_dataclasses(argv))


USAGE = ("cadence train --model MODEL --train_file FILE [--validation_file FILE] [--task TASK] [FLAG VALUE ...]\n"
         "       cadence train CONFIG.yaml|CONFIG.json\n"
         "       (FLAG: any TrainingArguments field, such as --learning_rate; cadence train --help lists them)")
DESCRIPTION = """examples:
  cadence train --model ./my-gpt2 --train_file train.txt --validation_file valid.txt --output_dir out \\
      --num_train_epochs 3 --learning_rate 3e-4
  cadence train --model ./bert-small --task sequence-classification --train_file train.csv \\
      --text_column sentence --label_column topic --output_dir classifier
  cadence train run.yaml        # the same flags as the keys of one YAML or JSON file

Train a transformers model on local text files (.txt, .csv, .json/.jsonl, .parquet): a causal language model, or a
sequence classifier. The data files and columns are checked before the model is loaded; the model, tokenizer,
all_results.json and trainer_state.json are saved to --output_dir, and report_to defaults to jsonl, so
`cadence plot OUTPUT_DIR` draws the run. Flags are spelled out in full (no abbreviations)."""


def training_args_groups() -> dict[str, str]:
    """``{field: group title}`` for ``TrainingArguments``: the ``# --- Title ---`` comments that group its fields in
    training_args.py as transformers' documentation groups them, read from that source, so the groups live in one
    place (a parenthesis after the title is dropped)."""
    from . import training_args

    text = Path(training_args.__file__).read_text(encoding="utf-8")
    groups, title = {}, None
    for line in text[text.index("\nclass TrainingArguments"):].splitlines()[2:]:
        if line and not line.startswith((" ", "#", ")")):  # the next top-level statement: the class has ended
            break
        heading = re.match(r"    # --- (.+?) ---", line)
        if heading:
            title = re.sub(r"\s*\(.*\)$", "", heading.group(1))
        else:
            name = re.match(r"    (\w+): ", line)
            if name and title:
                groups[name.group(1)] = title
    return groups


def help_parser() -> argparse.ArgumentParser:
    """The parser whose help ``cadence train --help`` prints: the same flags as the HfArgumentParser that parses (a
    test compares them), grouped as ``TrainingArguments``' documentation groups them, built without importing
    transformers so that the help comes as fast as ``import torch``."""
    import typing

    from .training_args import TrainingArguments

    parser = argparse.ArgumentParser(prog="cadence train", usage=USAGE, description=DESCRIPTION,
                                     formatter_class=_HelpFormatter, allow_abbrev=False)
    titles = training_args_groups()
    groups: dict[str, Any] = {}
    for owner in (TrainArguments, TrainingArguments):
        hints = typing.get_type_hints(owner)
        for spec in fields(owner):
            if not spec.init:
                continue
            title = "cadence train" if owner is TrainArguments else titles.get(spec.name, "other")
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            _add_help_flag(groups[title], spec, hints[spec.name])
    parser.set_defaults(report_to="jsonl")  # as parse() sets it
    return parser


def _add_help_flag(group, spec, hint) -> None:
    """One field as HfArgumentParser adds it, for display: both spellings, choices of a Literal or an Enum, ``[X]``
    for a yes/no flag, ``X [X ...]`` for a list, and the ``--no_`` form of a flag that defaults to True."""
    import enum
    import types
    import typing

    options = [f"--{spec.name}"] + ([f"--{spec.name.replace('_', '-')}"] if "_" in spec.name else [])
    shown = {key: value for key, value in spec.metadata.items() if key in ("help", "choices", "nargs", "metavar")}
    if spec.default is not MISSING:
        shown["default"] = spec.default
    elif spec.default_factory is not MISSING:
        shown["default"] = spec.default_factory()
    kind, none = hint, type(None)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # HfArgumentParser's rule for which type shows
        members = typing.get_args(hint)
        if none not in members:
            kind = members[0] if members[1] is str else members[1]
        elif bool not in members:
            kind = members[0] if members[1] is none else members[1]
        else:
            kind = bool
    if typing.get_origin(kind) is typing.Literal:
        shown.setdefault("choices", typing.get_args(kind))
    elif isinstance(kind, type) and issubclass(kind, enum.Enum):
        shown.setdefault("choices", [member.value for member in kind])
    elif kind is bool and (hint is bool or spec.default not in (None, MISSING)):  # `bool | None = None` takes a value
        shown.setdefault("nargs", "?")
    elif typing.get_origin(kind) is list:
        shown.setdefault("nargs", "+")
    group.add_argument(*options, **shown)
    if spec.default is True and kind is bool:
        group.add_argument(f"--no_{spec.name}", f"--no-{spec.name.replace('_', '-')}", action="store_false",
                           dest=spec.name, default=argparse.SUPPRESS,
                           help=argparse.SUPPRESS if shown.get("help") is argparse.SUPPRESS else f"--{spec.name} false")


def print_help() -> None:
    """``cadence train --help``."""
    help_parser().print_help()


def _parser_class():
    """HfArgumentParser whose usage errors print the short usage and the one line that matters (argparse's own
    usage would list every TrainingArguments flag: over a hundred lines)."""
    from transformers import HfArgumentParser

    class TrainParser(HfArgumentParser):
        def error(self, message: str):
            self.print_usage(sys.stderr)
            self.exit(2, f"{self.prog}: error: {message}\n")

    return TrainParser


def _unrecognized(parser, unknown: list[str]) -> str:
    """``unrecognized arguments: --learning_rat 1e-3 (did you mean --learning_rate?)``."""
    import difflib

    flags = [option for action in parser._actions for option in action.option_strings if option.startswith("--")]
    hints = []
    for arg in unknown:
        if arg.startswith("--"):
            close = difflib.get_close_matches(arg.split("=", 1)[0], flags, n=1)
            if close:
                hints.append(f"{arg.split('=', 1)[0]}: did you mean {close[0]}?")
    return f"unrecognized arguments: {' '.join(unknown)}" + (f" ({'; '.join(hints)})" if hints else "")


def _read_config(path: Path) -> dict[str, Any]:
    """The mapping of flags to values in a JSON or YAML file (ValueError naming the file otherwise)."""
    if not path.is_file():
        raise ValueError(f"config file {str(path)!r} does not exist")
    text = path.read_text(encoding="utf-8")
    try:
        if path.suffix == ".json":
            config = json.loads(text)
        else:
            import yaml

            config = yaml.safe_load(text)
    except Exception as error:  # noqa: BLE001 - json's ValueError or yaml's YAMLError: the parser says where
        raise ValueError(f"config file {str(path)!r} is not valid {path.suffix[1:].upper()}: {error}") from None
    if not isinstance(config, dict):
        got = "nothing" if config is None else f"a {type(config).__name__}"
        raise ValueError(
            f"config file {str(path)!r} holds {got}, not a mapping of flags to values; write one 'flag: value' per "
            "line (YAML) or one object (JSON), e.g. model: ./my-model"
        )
    return config


# ------------------------------------------------------------------------------------- data


def load_data(script: TrainArguments) -> dict[str, Any]:
    """The train (and validation) ``datasets.Dataset``; every file and column checked (ValueError naming it).

    Raises:
        ValueError: a missing file, an unknown extension, a missing column, an empty file, or a
            validation label the training file does not have.
    """
    if script.task not in TASKS:
        raise ValueError(f"--task={script.task!r} is invalid: use one of {', '.join(TASKS)}")
    files = {"train": ("--train_file", script.train_file)}
    if script.validation_file:
        files["validation"] = ("--validation_file", script.validation_file)
    columns = [("--text_column", script.text_column)]
    if script.task == "sequence-classification":
        columns.append(("--label_column", script.label_column))
    splits = {}
    for split, (flag, path) in files.items():
        splits[split] = ds = _read_file(flag, path)
        for column_flag, column in columns:
            if column not in ds.column_names:
                raise ValueError(
                    f"{column_flag}={column!r} is not a column of {flag}={path!r} (its columns: "
                    f"{', '.join(ds.column_names)}); pass {column_flag} with one of them"
                )
        if len(ds) == 0:
            raise ValueError(f"{flag}={path!r} has no rows")
        _check_texts(ds[script.text_column], flag, path, script.text_column)
    if script.task == "sequence-classification":
        _check_labels(splits, script.label_column, files)
    return splits


def _read_file(flag: str, path: str):
    import datasets

    suffix = Path(path).suffix.lower()
    if suffix not in BUILDERS:
        raise ValueError(f"{flag}={path!r}: unknown file type {suffix!r}; use one of {', '.join(BUILDERS)}")
    if not Path(path).is_file():
        raise ValueError(f"{flag}={path!r}: no such file")
    if Path(path).stat().st_size == 0:
        raise ValueError(f"{flag}={path!r} is empty: pass a file with data rows")
    options = {"keep_linebreaks": True} if BUILDERS[suffix] == "text" else {}  # lines joined into blocks keep their ends
    try:
        return datasets.load_dataset(BUILDERS[suffix], data_files={"train": path}, split="train", **options)
    except Exception as error:  # noqa: BLE001 - datasets' errors name neither the flag nor, often, the file
        if "corresponds to no data" in str(error):  # a CSV with only its header line
            raise ValueError(f"{flag}={path!r} has no rows (only a header?): pass a file with data rows") from None
        cause = error.__cause__ or error  # DatasetGenerationError wraps the parser's error
        what = str(cause).strip().splitlines()[0] if str(cause).strip() else type(cause).__name__
        raise ValueError(
            f"{flag}={path!r} could not be read as a {suffix} file ({type(cause).__name__}: {what[:300]}); fix the "
            f"file, or give it the extension of its format ({', '.join(BUILDERS)})"
        ) from error


def _check_texts(texts: list, flag: str, path: str, column: str) -> None:
    # None (an empty CSV cell) stops the tokenizer; only blank lines give a model no token to train on
    bad = next((i for i, text in enumerate(texts) if not isinstance(text, str)), None)
    if bad is not None:
        raise ValueError(
            f"--text_column={column!r} of {flag}={path!r}: row {bad} holds {texts[bad]!r}, not a text; fill in or "
            "remove that row"
        )
    if not any(text.strip() for text in texts):
        raise ValueError(f"{flag}={path!r} holds only blank texts in --text_column={column!r}: nothing to train on")


def _check_labels(splits: dict, column: str, files: dict) -> None:
    known = set(splits["train"][column])
    if "validation" in splits:
        unseen = sorted(set(splits["validation"][column]) - known, key=str)
        if unseen:
            raise ValueError(
                f"--label_column={column!r}: {files['validation'][0]}={files['validation'][1]!r} has labels the "
                f"training file does not have: {unseen[:5]}"
            )


def label_names(train) -> list:
    """The classes in id order: sorted (so ids do not depend on row order)."""
    return sorted(set(train), key=lambda v: (isinstance(v, str), v))


# ------------------------------------------------------------------------------------- model


def load_model(script: TrainArguments, labels: list | None):
    """``(model, tokenizer, how)``: fine-tuned from weights, or a new model from a config ("from scratch")."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    auto = AutoModelForCausalLM if script.task == "causal-lm" else AutoModelForSequenceClassification
    folder = Path(script.model)
    tokenizer_source = script.tokenizer or script.model
    if folder.is_dir():
        if not (folder / "config.json").is_file():  # transformers would say "Unrecognized model", naming no flag
            raise ValueError(
                f"--model={script.model!r} is a folder without config.json: pass the folder a model was saved to "
                "(save_pretrained writes config.json), or a model type such as 'gpt2' with --tokenizer FOLDER"
            )
        config = AutoConfig.from_pretrained(folder)
        pretrained = any((folder / name).is_file() for name in WEIGHT_FILES)
    elif script.model in CONFIG_MAPPING:
        if script.tokenizer is None:
            raise ValueError(f"--model={script.model!r} is a model type (a new model): pass --tokenizer FOLDER as well")
        config, pretrained = AutoConfig.for_model(script.model), False
    else:  # a Hub id
        config = _from_hub("--model", script.model, lambda: AutoConfig.from_pretrained(script.model))
        pretrained = True
    tokenizer_flag = "--tokenizer" if script.tokenizer else "--model"
    tokenizer = _from_hub(tokenizer_flag, tokenizer_source, lambda: AutoTokenizer.from_pretrained(tokenizer_source))
    if tokenizer.pad_token is None and script.task == "sequence-classification":  # batches of texts need padding
        if tokenizer.eos_token is None:
            raise ValueError(f"the tokenizer of {tokenizer_source!r} has no pad and no eos token: add a pad token to it")
        tokenizer.pad_token = tokenizer.eos_token
    if script.config_overrides:
        if pretrained:
            raise ValueError(f"--config_overrides applies to a new model, but {script.model!r} has weights")
        try:
            config.update_from_string(script.config_overrides)
        except ValueError as error:  # an unknown key, or a value of the wrong type
            raise ValueError(f"--config_overrides={script.config_overrides!r} is invalid: {error}") from None
    if labels is not None:
        config.num_labels = len(labels)
        config.id2label = {i: str(v) for i, v in enumerate(labels)}
        config.label2id = {str(v): i for i, v in enumerate(labels)}
        config.pad_token_id = tokenizer.pad_token_id
    if pretrained:
        model = _from_hub("--model", script.model, lambda: auto.from_pretrained(
            script.model, config=config, ignore_mismatched_sizes=labels is not None))
    else:
        by_type = not folder.is_dir()  # a model type's default vocabulary belongs to another tokenizer
        overridden = "vocab_size=" in (script.config_overrides or "")
        if hasattr(config, "vocab_size") and not overridden and (by_type or config.vocab_size < len(tokenizer)):
            config.vocab_size = len(tokenizer)  # every token id has an embedding
        model = auto.from_config(config)
    return model, tokenizer, "fine-tuned" if pretrained else "from scratch"


_FIXES = {
    "--model": "pass a model folder (with config.json), a model type such as 'gpt2' with --tokenizer FOLDER, or a Hub "
               "id that exists (downloaded once while online, it is read from the cache offline)",
    "--tokenizer": "pass a folder holding a saved tokenizer, or a Hub id that exists (downloaded once while online, "
                   "it is read from the cache offline)",
}


def _from_hub(flag: str, name: str, load):
    """``load()``; transformers' OSError for a name that is neither a folder nor a Hub id it can fetch becomes a
    one-line ValueError naming the flag and the value (``cadence train: error: ...``, exit 2), not a traceback."""
    try:
        return load()
    except OSError as error:
        from .hub import offline_mode

        text = str(error).strip()
        why = f"{type(error).__name__}: {text.splitlines()[0].rstrip('.') if text else 'no message'}"
        where = "" if Path(name).is_dir() else "it is not a local folder, and as a Hub id "
        offline = "(HF_HUB_OFFLINE=1: only the local cache is read) " if offline_mode() else ""
        raise ValueError(
            f"{flag}={name!r} could not be loaded: {where}{offline}it gave {why[:300]}; {_FIXES[flag]}"
        ) from None


def _positions(config) -> tuple[str, int] | None:
    """The config field holding the longest sequence the model embeds, and its value."""
    for name in ("n_positions", "max_position_embeddings", "n_ctx"):
        if isinstance(getattr(config, name, None), int):
            return name, getattr(config, name)
    return None


def default_block_size(model, tokenizer) -> int:
    limits = [1024, tokenizer.model_max_length]
    if _positions(model.config) is not None:
        limits.append(_positions(model.config)[1])
    return min(limits)


def check_block_size(block_size: int, model) -> None:
    """A block longer than the model's position table fails inside the first forward (an IndexError)."""
    positions = _positions(model.config)
    if positions is not None and block_size > positions[1]:
        name, limit = positions
        raise ValueError(
            f"--block_size={block_size} is larger than the model's {name}={limit}: it embeds at most {limit} "
            f"positions; pass --block_size {limit} or less (or leave it out)"
        )


# ------------------------------------------------------------------------------------- tokenizing


def tokenize(splits: dict, script: TrainArguments, tokenizer, block_size: int, labels: list | None) -> dict:
    """Each split as model inputs: causal LM -> ``block_size`` blocks with ``labels``; classification -> truncated rows."""
    out = {}
    for split, ds in splits.items():
        if script.task == "causal-lm":
            ids = ds.map(lambda rows: tokenizer(rows[script.text_column]), batched=True, remove_columns=ds.column_names)
            out[split] = ids.map(lambda rows: _blocks(rows, block_size), batched=True, batch_size=None,
                                 remove_columns=ids.column_names)
        else:
            label_ids = {v: i for i, v in enumerate(labels)}

            def encode(rows):
                enc = tokenizer(rows[script.text_column], truncation=True, max_length=block_size)
                enc["labels"] = [label_ids[v] for v in rows[script.label_column]]
                return enc

            out[split] = ds.map(encode, batched=True, remove_columns=ds.column_names)
    return out


def _blocks(rows: dict, block_size: int) -> dict:
    """All texts concatenated and cut into ``block_size`` pieces; the remainder is dropped (kept when it is all there is)."""
    ids = [t for row in rows["input_ids"] for t in row]
    n = max(len(ids) // block_size, 1)
    blocks = [ids[i * block_size: (i + 1) * block_size] for i in range(n)]
    return {"input_ids": blocks, "labels": [list(b) for b in blocks]}


# ------------------------------------------------------------------------------------- the job


def run_train(argv: list[str]) -> dict[str, Any]:
    """``cadence train``: parse, check the data, load the model, train, evaluate, save; returns the metrics."""
    try:
        import datasets  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as error:
        raise ImportError(f"cadence train needs transformers and datasets ({error}): pip install 'cadence[hf]'") from None
    from .trainer import Trainer

    script, args = parse(argv)
    splits = load_data(script)  # every file and column checked before the model is loaded
    labels = label_names(splits["train"][script.label_column]) if script.task == "sequence-classification" else None
    model, tokenizer, how = load_model(script, labels)
    block_size = script.block_size or default_block_size(model, tokenizer)
    check_block_size(block_size, model)
    data = tokenize(splits, script, tokenizer, block_size, labels)
    trainer = Trainer(model, args, train_dataset=data["train"], eval_dataset=data.get("validation"),
                      processing_class=tokenizer)
    result = trainer.train(resume_from_checkpoint=resume_argument(args.resume_from_checkpoint))
    if trainer.state.interrupted:  # the checkpoint is saved; the model is partly trained: no final outputs
        raise SystemExit(_interrupted_exit_status(trainer))
    metrics = dict(result.metrics)
    if "validation" in data:
        metrics.update(trainer.evaluate())
        if script.task == "causal-lm":
            metrics["eval_perplexity"] = math.exp(min(metrics["eval_loss"], 50))
    trainer.save_model()
    if args.should_save:
        trainer.state.save_to_json(os.path.join(args.output_dir, "trainer_state.json"))
        with open(os.path.join(args.output_dir, "all_results.json"), "w", encoding="utf-8") as f:
            json.dump(metrics, f, indent=2)
    _print_summary(script, args, how, len(data["train"]), block_size, metrics)
    return metrics


def resume_argument(value: str | None) -> str | bool | None:
    """``--resume_from_checkpoint``: a folder, or a word of HfArgumentParser's bools: true resumes the newest
    checkpoint in ``--output_dir`` (``train(resume_from_checkpoint=True)``), false starts afresh.
    A folder of that name wins over the word."""
    from .training_args import _FALSE_WORDS, _TRUE_WORDS

    if value is None or os.path.isdir(value):
        return value
    word = value.strip().lower()
    if word in _TRUE_WORDS:
        return True
    if word in _FALSE_WORDS:
        return None
    return value


def _interrupted_exit_status(trainer) -> int:
    """128 + the signal's number, as a shell reports a process the signal ended: a scheduler that requeues
    failed jobs (SLURM --requeue, torchrun --max-restarts, a Kubernetes restart) starts it again, and
    ``--resume_from_checkpoint true`` continues from the checkpoint."""
    import signal

    from .checkpoint.signals import JITCheckpointCallback

    jit = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, JITCheckpointCallback))
    # "a signal to another process" (a rank that saw none): SIGTERM's status, the usual scheduler signal
    number = getattr(signal, str(jit.requested), signal.SIGTERM)
    print(f"cadence train: interrupted by {jit.requested} at step {trainer.state.global_step}: "
          f"checkpoint-{trainer.state.global_step} is saved in {trainer.args.output_dir}, no final model is written; "
          f"exit status {128 + int(number)}. Run the same command with --resume_from_checkpoint true to continue.",
          file=sys.stderr)
    return 128 + int(number)


def _print_summary(script, args, how: str, rows: int, block_size: int, metrics: dict) -> None:
    out = Path(args.output_dir).resolve()
    lines = [f"\ncadence train: {script.task} model {script.model!r} ({how}), {rows} training rows of up to {block_size} tokens",
             f"  train loss  {metrics['train_loss']:.4f} ({metrics['train_runtime']:.1f} s)"]
    if "eval_loss" in metrics:
        lines.append(f"  eval loss   {metrics['eval_loss']:.4f}"
                     + (f", perplexity {metrics['eval_perplexity']:.2f}" if "eval_perplexity" in metrics else ""))
    lines.append(f"  model       {out} (config.json, model.safetensors, tokenizer)")
    lines.append(f"  metrics     {out / 'all_results.json'}, history {out / 'trainer_state.json'}")
    if "jsonl" in args.report_to:
        lines.append(f"  curves      cadence plot {out}")
    for name in args.report_to:
        if name == "tensorboard":
            lines.append(f"  tensorboard tensorboard --logdir {args.logging_dir or out / 'runs'}")
    print("\n".join(lines))
