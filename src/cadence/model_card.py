"""A model card (``README.md``) from a finished run, in the layout of ``transformers.Trainer.create_model_card``.

Built from what the run knows, with no network: the arguments (hyperparameters), ``state.log_history``
(the training-results table and the last evaluation) and the datasets. The sections, the hyperparameter
lines and the results table read as transformers writes them, so tools that parse those cards keep
working; the YAML header is written by hand (plain JSON scalars, which YAML reads) so no YAML package
is needed.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Speed keys are left out of the results, as in transformers' cards.
_SPEED_KEYS = ("runtime", "samples_per_second", "steps_per_second")
# Datasets built from local files carry these builder names; they are not Hub datasets to link to.
_LOCAL_BUILDERS = ("csv", "json", "pandas", "parquet", "text", "arrow", "generator")


def _as_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _title(key: str) -> str:
    """``eval_exact_match`` -> ``Exact Match`` (the prefix is the split, not part of the name)."""
    return " ".join(part.capitalize() for part in key.split("_"))


def _rounded(value: Any, decimals: int = 4) -> str:
    """A float with more than ``decimals`` decimals is written with exactly ``decimals``; anything else as is."""
    text = str(value)
    if isinstance(value, float) and "." in text and len(text.split(".")[1]) > decimals:
        return f"{value:.{decimals}f}"
    return text


def results_from_log_history(log_history: list[dict[str, Any]]) -> tuple[list[dict[str, Any]] | None, dict[str, Any] | None]:
    """The training-results rows (one per evaluation during training) and the last evaluation's metrics.

    Each row: the last logged training loss before it ("No log" when none), epoch, step, the
    validation loss and the other metrics titled (``eval_accuracy`` -> ``Accuracy``).

    Returns:
        ``(rows, last_eval)``: ``rows`` is None when training did not finish (no ``train_runtime`` log);
        ``last_eval`` keys are titled and without the speed keys, or None.
    """
    end = next((i for i, entry in enumerate(log_history) if "train_runtime" in entry), None)
    rows: list[dict[str, Any]] | None = None  # None: the run never finished training (no results section)
    skip = ("epoch", "step", "total_flos", *(f"eval_{k}" for k in _SPEED_KEYS))
    if end is not None:
        rows = []
        training_loss: Any = "No log"
        for entry in log_history[:end]:
            if "loss" in entry:
                training_loss = entry["loss"]
            if "eval_loss" not in entry:
                continue
            row = {"Training Loss": training_loss, "Epoch": entry.get("epoch"), "Step": entry.get("step")}
            for key, value in entry.items():
                if key == "eval_loss":
                    row["Validation Loss"] = value
                elif key not in skip:  # the split prefix ("eval") is dropped from the name
                    row[_title(key.split("_", 1)[1] if "_" in key else "")] = value
            rows.append(row)
    evals = [entry for entry in log_history if "eval_loss" in entry]
    last = None
    if evals:
        last = {_title(k.removeprefix("eval_")): v for k, v in evals[-1].items()
                if k.removeprefix("eval_") not in (*_SPEED_KEYS, "epoch", "step")}
    return rows, last


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """Rows of equal keys as a Markdown table with centred columns, padded to the widest cell."""
    if not rows:
        return ""
    widths = {key: max(len(key), *(len(_rounded(row[key])) for row in rows)) for key in rows[0]}

    def line(cells: list[str]) -> str:
        return "".join(f"| {cell}" + " " * (width - len(cell) + 1) for cell, width in zip(cells, widths.values())) + "|\n"

    table = line(list(widths))
    table += "".join(f"|:{'-' * width}:" for width in widths.values()) + "|\n"
    return table + "".join(line([_rounded(row[key]) for key in widths]) for row in rows)


def hyperparameters(args: Any) -> dict[str, Any]:
    """The hyperparameter lines of the card (transformers' selection, names and wording)."""
    hp: dict[str, Any] = {"learning_rate": args.learning_rate, "train_batch_size": args.train_batch_size,
                          "eval_batch_size": args.eval_batch_size, "seed": args.seed}
    if args.world_size > 1:
        hp["distributed_type"] = "multi-GPU"
        hp["num_devices"] = args.world_size
    if args.gradient_accumulation_steps > 1:
        hp["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    from .loop_state import BatchLayout

    total_train = BatchLayout.from_args(args).global_batch
    if total_train != hp["train_batch_size"]:
        hp["total_train_batch_size"] = total_train
    if args.eval_batch_size * args.world_size != hp["eval_batch_size"]:
        hp["total_eval_batch_size"] = args.eval_batch_size * args.world_size
    optim = str(getattr(args.optim, "value", args.optim))
    extra = args.optim_args or "No additional optimizer arguments"
    if "adam" in optim.lower():
        hp["optimizer"] = (f"Use {optim} with betas=({args.adam_beta1},{args.adam_beta2}) and epsilon={args.adam_epsilon} "
                           f"and optimizer_args={extra}")
    else:
        hp["optimizer"] = f"Use {optim} and the args are:\n{extra}"
    hp["lr_scheduler_type"] = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
    if args.warmup_steps != 0:
        hp["lr_scheduler_warmup_steps"] = args.warmup_steps
    if args.max_steps != -1:
        hp["training_steps"] = args.max_steps
    else:
        hp["num_epochs"] = args.num_train_epochs
    if args.fp16:
        hp["mixed_precision_training"] = "Native AMP"
    if args.label_smoothing_factor != 0.0:
        hp["label_smoothing_factor"] = args.label_smoothing_factor
    return hp


def _yaml_header(metadata: dict[str, Any]) -> str:
    """A YAML block of scalars, lists of scalars and the model-index (JSON scalars are valid YAML)."""
    lines = []
    for key, value in metadata.items():
        if key == "model-index":
            lines += ["model-index:", f"- name: {json.dumps(value)}", "  results: []"]
        elif isinstance(value, list):
            lines += [f"{key}:", *(f"- {json.dumps(v)}" for v in value)]
        else:
            lines.append(f"{key}: {json.dumps(value)}")
    return "---\n" + "\n".join(lines) + "\n---\n"


def _hub_dataset_name(dataset: Any) -> str | None:
    """The builder name of a Hugging Face dataset from the Hub (None for local files and other datasets)."""
    name = getattr(dataset, "builder_name", None)
    return name if isinstance(name, str) and name not in _LOCAL_BUILDERS else None


def _framework_versions() -> str:
    import torch

    from .version import __version__

    lines = [f"- cadence {__version__}", f"- Pytorch {torch.__version__}"]
    for package, title in (("transformers", "Transformers"), ("datasets", "Datasets"), ("tokenizers", "Tokenizers")):
        try:
            module = __import__(package)
        except ImportError:
            continue
        lines.append(f"- {title} {module.__version__}")
    return "\n".join(lines) + "\n"


def model_card(trainer: Any, language: str | list[str] | None = None, license: str | None = None,
               tags: str | list[str] | None = None, model_name: str | None = None, finetuned_from: str | None = None,
               tasks: str | list[str] | None = None, dataset_tags: str | list[str] | None = None,
               dataset: str | list[str] | None = None, dataset_args: str | list[str] | None = None) -> str:
    """The card's text for ``trainer`` (see ``Trainer.create_model_card`` for the arguments)."""
    one = trainer.eval_dataset if trainer.eval_dataset is not None else trainer.train_dataset
    if dataset_tags is None and _hub_dataset_name(one) is not None:
        dataset_tags = [_hub_dataset_name(one)]
    if dataset is None:
        dataset = dataset_tags
    config = getattr(trainer.model, "config", None)
    source = getattr(config, "_name_or_path", None)
    if finetuned_from is None and source and not os.path.isdir(source):
        finetuned_from = source  # a Hub name, not a local folder
    model_name = model_name or Path(trainer.args.output_dir).name or finetuned_from
    tags = _as_list(tags)
    if "generated_from_trainer" not in tags:
        tags.append("generated_from_trainer")
    rows, last_eval = results_from_log_history(trainer.state.log_history)

    metadata: dict[str, Any] = {"library_name": "transformers" if config is not None else "pytorch"}
    if language:
        metadata["language"] = _as_list(language)
    if license:
        metadata["license"] = license
    if finetuned_from:
        metadata["base_model"] = finetuned_from
    metadata["tags"] = tags
    if dataset_tags:
        metadata["datasets"] = _as_list(dataset_tags)
    metadata["model-index"] = model_name
    del tasks, dataset_args  # accepted for transformers' signature; the card has no task/dataset results block

    card = _yaml_header(metadata)
    card += ("\n<!-- This model card has been generated automatically according to the information the Trainer had "
             "access to. You\nshould probably proofread and complete it, then remove this comment. -->\n")
    card += f"\n# {model_name}\n\n"
    card += (f"This model is a fine-tuned version of [{finetuned_from}](https://huggingface.co/{finetuned_from}) on "
             if finetuned_from else "This model was trained from scratch on ")
    names = _as_list(dataset)
    if not names:
        card += "an unknown dataset."
    elif len(names) == 1:
        card += f"the {names[0]} dataset."
    else:
        card += ", ".join(f"the {n}" for n in names[:-1]) + f" and the {names[-1]} datasets."
    if last_eval is not None:
        card += "\nIt achieves the following results on the evaluation set:\n"
        card += "\n".join(f"- {name}: {_rounded(value)}" for name, value in last_eval.items())
    card += "\n"
    for section in ("Model description", "Intended uses & limitations", "Training and evaluation data"):
        card += f"\n## {section}\n\nMore information needed\n"
    card += "\n## Training procedure\n\n### Training hyperparameters\n\nThe following hyperparameters were used during training:\n"
    card += "\n".join(f"- {name}: {value}" for name, value in hyperparameters(trainer.args).items()) + "\n"
    if rows is not None:
        card += "\n### Training results\n\n" + markdown_table(rows) + "\n"
    card += "\n### Framework versions\n\n" + _framework_versions()
    return card
