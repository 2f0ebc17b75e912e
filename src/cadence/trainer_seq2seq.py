"""``Seq2SeqTrainer``: the ``Trainer`` whose evaluation can generate (summarization, translation, speech-to-text).

Only ``prediction_step`` changes, and only with ``predict_with_generate=True`` when predictions are wanted: the
batch's predictions are then ``model.generate(...)``'s token ids instead of logits. Everything else is the
``Trainer``'s: the loss is computed by ``compute_loss`` as always (so it stays exact and item-weighted, and a
subclass's ``compute_loss`` is honoured), training is untouched, and ``evaluate``/``predict`` only record the
generation options (``**gen_kwargs``, else ``generation_max_length``/``generation_num_beams``) for the steps.

Generation runs on the unwrapped model (``self.model``: DDP's wrapper has no ``generate``), under ``no_grad`` and the
forward's autocast, as the loss does. Generated tokens (and labels) are padded with the pad token (else eos) to the
longest length generation can reach, so every batch, on every process, has one width and nothing is padded with -100
when predictions are gathered and concatenated (transformers pads to the same width: the two give the same arrays).
A decoder-only model given ``max_new_tokens`` returns its prompt too, whose length varies: such batches are
concatenated with -100 between them, as in transformers.
"""

from __future__ import annotations

import copy
import logging
import numbers
import os
from typing import Any

import torch
from torch import nn

from .trainer import Trainer
from .trainer_utils import PredictionOutput

logger = logging.getLogger(__name__)

_DEFAULT_MAX_LENGTH = 20  # transformers' GenerationConfig default when neither config nor call sets one


class Seq2SeqTrainer(Trainer):
    """``Trainer`` with ``predict_with_generate``; the API of ``transformers.Seq2SeqTrainer``.

    The arguments are those of ``Trainer``; ``args`` is usually a ``Seq2SeqTrainingArguments`` (its
    ``generation_config`` is loaded into ``model.generation_config`` here, so a bad one fails before training).

    Example:
        >>> args = Seq2SeqTrainingArguments("out", predict_with_generate=True, generation_num_beams=2)
        >>> trainer = Seq2SeqTrainer(model, args, train_dataset=train, eval_dataset=dev, compute_metrics=rouge)
        >>> trainer.evaluate(max_length=64)["eval_rouge1"]
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        config = getattr(self.args, "generation_config", None)
        if config is not None:
            self.model.generation_config = self.load_generation_config(config)
        if getattr(self.args, "predict_with_generate", False):
            _check_can_generate(self.model)
        self._gen_kwargs: dict[str, Any] = {}

    def train(self, *args: Any, **kwargs: Any):
        """``Trainer.train``; with ``predict_with_generate``, the generation settings its evaluations will use are
        checked first, so a bad one fails before the first step, not at the first evaluation."""
        if getattr(self.args, "predict_with_generate", False):
            self._check_generation({}, "train")
        return super().train(*args, **kwargs)

    def _check_generation(self, gen_kwargs: dict[str, Any], call: str) -> dict[str, Any]:
        """The options generation will use (``gen_kwargs`` with the arguments' defaults), checked together with the
        model's generation config; returned."""
        options = self._generation_options(gen_kwargs)
        if getattr(self.args, "predict_with_generate", False):
            check_generation_settings(getattr(self.model, "generation_config", None), options, gen_kwargs, call)
        return options

    @staticmethod
    def load_generation_config(gen_config_arg: Any):
        """A ``GenerationConfig`` from ``Seq2SeqTrainingArguments.generation_config``: a copy of a given one, or
        loaded from a folder, a file in one, or a Hub model id; validated strictly.

        Args:
            gen_config_arg: a ``GenerationConfig``, a path, or a model id.

        Returns:
            the ``GenerationConfig``.
        """
        from transformers import GenerationConfig  # optional: generation is transformers' models' feature

        if isinstance(gen_config_arg, GenerationConfig):
            config = copy.deepcopy(gen_config_arg)
        else:
            where, name = os.fspath(gen_config_arg), None
            if os.path.isfile(where):  # a file: its folder, and its name
                where, name = os.path.dirname(where) or ".", os.path.basename(where)
            try:
                config = GenerationConfig.from_pretrained(where, name)
            except Exception as error:  # noqa: BLE001 - say which argument could not be loaded
                raise ValueError(
                    f"generation_config={gen_config_arg!r} could not be loaded ({type(error).__name__}: {error}); pass "
                    "a folder or file written by GenerationConfig.save_pretrained, a GenerationConfig, or a model id"
                ) from error
        try:
            config.validate(strict=True)
        except ValueError as error:
            raise ValueError(f"generation_config is invalid: {error}\n\nFix these issues to train your model.") from None
        return config

    # ------------------------------------------------------------------ evaluate / predict: record the options

    def evaluate(self, eval_dataset: Any = None, ignore_keys: list[str] | None = None, metric_key_prefix: str = "eval",
                 **gen_kwargs: Any) -> dict[str, float]:
        """``Trainer.evaluate`` generating with ``gen_kwargs`` (``max_length``, ``max_new_tokens``, ``num_beams``,
        any other ``generate`` option) when ``predict_with_generate``.

        Args:
            eval_dataset, ignore_keys, metric_key_prefix: as ``Trainer.evaluate``.
            gen_kwargs: for ``model.generate``; ``max_length`` defaults to ``generation_max_length`` (unless
                ``max_new_tokens`` is given) and ``num_beams`` to ``generation_num_beams``.

        Example:
            >>> trainer.evaluate(max_new_tokens=32, num_beams=4)
        """
        datasets = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(datasets, dict):  # each entry evaluated here, so every one generates with gen_kwargs
            metrics: dict[str, float] = {}
            for name, dataset in datasets.items():
                metrics.update(self.evaluate(dataset, ignore_keys, f"{metric_key_prefix}_{name}", **gen_kwargs))
            return metrics
        self._gen_kwargs = self._check_generation(gen_kwargs, "evaluate")
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset: Any, ignore_keys: list[str] | None = None, metric_key_prefix: str = "test",
                **gen_kwargs: Any) -> PredictionOutput:
        """``Trainer.predict`` generating with ``gen_kwargs`` when ``predict_with_generate`` (see ``evaluate``).

        Example:
            >>> trainer.predict(test_ds, num_beams=4).predictions  # token ids, padded with the pad token
        """
        self._gen_kwargs = self._check_generation(gen_kwargs, "predict")
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def _generation_options(self, gen_kwargs: dict[str, Any]) -> dict[str, Any]:
        """``gen_kwargs`` with the arguments' defaults (transformers' rules)."""
        options = dict(gen_kwargs)
        max_length, num_beams = getattr(self.args, "generation_max_length", None), getattr(self.args, "generation_num_beams", None)
        if options.get("max_length") is None and options.get("max_new_tokens") is None and max_length is not None:
            options["max_length"] = max_length
        if options.get("num_beams") is None and num_beams is not None:
            options["num_beams"] = num_beams
        return options

    # ------------------------------------------------------------------ one evaluation batch

    def prediction_step(self, model: nn.Module, inputs: dict[str, Any], prediction_loss_only: bool,
                        ignore_keys: list[str] | None = None, **gen_kwargs: Any) -> tuple[torch.Tensor | None, Any, Any]:
        """``(loss, generated token ids, labels)`` with ``predict_with_generate``, else ``Trainer.prediction_step``.

        Args:
            model: the model in eval mode (possibly wrapped; generation uses ``self.model``).
            inputs: the batch.
            prediction_loss_only: return only the loss (nothing is generated).
            ignore_keys: output keys to drop (used without generation).
            gen_kwargs: for ``generate``; default: what ``evaluate``/``predict`` recorded.
        """
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only=prediction_loss_only, ignore_keys=ignore_keys)
        inputs = self._prepare_inputs(inputs)
        options = {k: v for k, v in (gen_kwargs or self._gen_kwargs).items() if v is not None}
        options.setdefault("synced_gpus", self.backend.shards_parameters)  # sharded weights: forwards are collectives
        generation_inputs = dict(inputs)
        labels = inputs.get("labels")
        decoder_ids = inputs.get("decoder_input_ids")
        if labels is not None and decoder_ids is not None and labels.shape == decoder_ids.shape:
            # decoder inputs made from the labels (teacher forcing) would hand generation the answer
            generation_inputs.pop("decoder_input_ids")
            generation_inputs.pop("decoder_attention_mask", None)
        with torch.no_grad(), self.compute_loss_context_manager():
            generated = self.model.generate(**generation_inputs, **options)
        width = self._generation_width(options)
        generated = self._pad_tensors_to_max_len(generated, width)

        loss = None
        if labels is not None:  # the loss as without generation: compute_loss, exact and item-weighted
            loss, _, _ = super().prediction_step(model, inputs, prediction_loss_only=True, ignore_keys=ignore_keys)
            labels = self._pad_tensors_to_max_len(labels, width)
        return loss, generated, labels

    def _generation_width(self, options: dict[str, Any]) -> int:
        """The longest sequence this generation can return: every batch is padded to it, so batches and
        processes agree (transformers pads to the generation config's ``max_length``, or ``max_new_tokens + 1``)."""
        config = getattr(self.model, "generation_config", None)
        config_max = getattr(config, "max_length", None) or _DEFAULT_MAX_LENGTH
        new_tokens = options.get("max_new_tokens", getattr(config, "max_new_tokens", None))
        longest = max(config_max, options.get("max_length") or 0)
        if new_tokens is not None:  # the decoder's start token, then that many new ones
            longest = max(longest, new_tokens + 1)
        return longest

    def _pad_tensors_to_max_len(self, tensor: torch.Tensor, max_length: int) -> torch.Tensor:
        """``tensor`` (rows x length) padded on the right to ``max_length`` with the pad token (transformers' name)."""
        if tensor.shape[-1] >= max_length:
            return tensor
        padded = tensor.new_full((tensor.shape[0], max_length), self._pad_token_id())
        padded[:, : tensor.shape[-1]] = tensor
        return padded

    def _pad_token_id(self) -> int:
        """The tokenizer's pad token (else its eos), else the model config's, else its generation config's pad/eos."""
        pad = _token_id(self.processing_class, "pad_token_id", "eos_token_id")
        if pad is None:
            pad = _token_id(getattr(self.model, "config", None), "pad_token_id")
        if pad is None:
            pad = _token_id(getattr(self.model, "generation_config", None), "pad_token_id", "eos_token_id")
        if pad is None:
            raise ValueError(
                "predict_with_generate needs a token id to pad generated sequences with, and found none: set "
                "model.config.pad_token_id (or model.generation_config.pad_token_id), or pass a tokenizer with a "
                "pad or eos token as processing_class"
            )
        return pad


def _token_id(owner: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(owner, name, None)
        if isinstance(value, (list, tuple)):  # several eos tokens: the first
            value = value[0] if value else None
        if value is not None:
            return int(value)
    return None


def _check_can_generate(model: nn.Module) -> None:
    if not callable(getattr(model, "generate", None)):
        raise ValueError(
            f"predict_with_generate=True needs a model with a generate() method (a transformers generation model); "
            f"{type(model).__name__} has none: set predict_with_generate=False, or give the model a generate()"
        )


# generation settings that count something: at least this many (GenerationConfig.validate leaves them to generate(),
# which fails deep inside: ZeroDivisionError for num_beams=0, "negative dimension" for num_beams=-3)
_AT_LEAST = {"num_beams": 1, "num_return_sequences": 1, "max_length": 1, "max_new_tokens": 1, "min_length": 0,
             "min_new_tokens": 0, "num_beam_groups": 1, "no_repeat_ngram_size": 0}


def check_generation_settings(config: Any, options: dict[str, Any], gen_kwargs: dict[str, Any], call: str) -> None:
    """The settings ``generate`` will run with (``config`` updated with ``options``) refused when invalid, naming the
    setting, its value and where it came from: ``{call}(...)``'s keyword, the generation_num_beams /
    generation_max_length arguments, or ``model.generation_config``. ``GenerationConfig.validate`` catches what it
    knows (major issues only: a shipped config's minor ones stay warnings, as in ``generate``).

    Raises:
        ValueError: a count below its minimum or not a whole number, or what ``validate`` refuses.
    """
    def source(name: str) -> str:
        if name in gen_kwargs:
            return f"{call}({name}={gen_kwargs[name]!r})"
        if name in options:
            return f"generation_{'num_beams' if name == 'num_beams' else 'max_length'}={options[name]!r} (Seq2SeqTrainingArguments)"
        return f"{name}={getattr(config, name)!r} (from model.generation_config)"

    for name, least in _AT_LEAST.items():
        value = options[name] if name in options else getattr(config, name, None)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy ints count
            raise ValueError(f"{source(name)} is invalid for generation: {name} must be a whole number >= {least}, got "
                             f"{type(value).__name__}; pass e.g. {name}={max(least, 1)}")
        if value < least:
            raise ValueError(f"{source(name)} is invalid for generation: {name} must be at least {least}; "
                             f"set {name}={max(least, 1)} or more" + (" (1 is greedy search)" if name == "num_beams" else ""))
    if config is None or not hasattr(config, "validate"):
        return
    merged = copy.deepcopy(config)
    for name, value in options.items():
        if hasattr(merged, name):
            setattr(merged, name, value)
    try:  # major issues only: minor ones (a shipped config's sampling flags) are generate()'s to warn about
        merged.validate(user_set_attributes=set())
    except ValueError as error:
        raise ValueError(f"the generation settings of {call}() are invalid (model.generation_config updated with "
                         f"{options}): {error}") from None
