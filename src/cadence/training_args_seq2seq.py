"""``Seq2SeqTrainingArguments``: ``TrainingArguments`` plus what evaluation by generation needs.

The fields, names and defaults are transformers' (``transformers.Seq2SeqTrainingArguments``); only
``Seq2SeqTrainer`` reads them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from .training_args import TrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    """``TrainingArguments`` with the generation options of ``Seq2SeqTrainer``.

    Example:
        >>> args = Seq2SeqTrainingArguments("out", predict_with_generate=True, generation_num_beams=4)
        >>> args.generation_num_beams
        4
    """

    sortish_sampler: bool = field(
        default=False,
        metadata={"help": "transformers 4.x option that transformers 5 ignores; True is accepted with a warning. "
                          "Use train_sampling_strategy='group_by_length' to batch samples of similar length."},
    )
    predict_with_generate: bool = field(
        default=False,
        metadata={"help": "Evaluate and predict with model.generate(): the predictions are generated token ids "
                          "(for ROUGE, BLEU, ...) instead of logits. The loss is computed as without it."},
    )
    generation_max_length: int | None = field(
        default=None,
        metadata={"help": "max_length for generate() in evaluation and prediction (default: the model's "
                          "generation_config.max_length)."},
    )
    generation_num_beams: int | None = field(
        default=None,
        metadata={"help": "num_beams for generate() in evaluation and prediction (default: the model's "
                          "generation_config.num_beams); 1 is greedy search."},
    )
    # Typed str for HfArgumentParser; a GenerationConfig or a path is accepted too (checked in __post_init__).
    generation_config: str | None = field(
        default=None,
        metadata={"help": "A GenerationConfig, a folder or file written by GenerationConfig.save_pretrained, or a "
                          "Hub model id: the model generates with it in evaluation and prediction."},
    )

    def __post_init__(self):
        super().__post_init__()
        _check_generation_options(self)

    def to_dict(self) -> dict[str, Any]:
        """``TrainingArguments.to_dict`` with a ``GenerationConfig`` written as its dict and a path as a string."""
        d = super().to_dict()
        config = d.get("generation_config")
        if hasattr(config, "to_dict"):
            d["generation_config"] = config.to_dict()
        elif isinstance(config, os.PathLike):
            d["generation_config"] = os.fspath(config)
        return d


def _check_generation_options(args: Seq2SeqTrainingArguments) -> None:
    """Errors at construction (before any step) naming the field, the value and the fix."""
    for name in ("generation_max_length", "generation_num_beams"):
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name}={value!r} is invalid: it must be a positive integer or None; "
                             f"pass e.g. {name}={128 if name == 'generation_max_length' else 4}, or None for the "
                             "model's generation_config")
    config = args.generation_config
    if config is not None and not isinstance(config, (str, os.PathLike)) and not hasattr(config, "to_dict"):
        raise ValueError(f"generation_config={config!r} is invalid: it must be a GenerationConfig, a folder or file "
                         "written by GenerationConfig.save_pretrained, or a Hub model id")
    if args.sortish_sampler:
        logger.warning("sortish_sampler=True has no effect (transformers 5 ignores it too); to batch samples of "
                       "similar length set train_sampling_strategy='group_by_length'")
