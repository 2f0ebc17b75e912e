"""Dropping the columns a model's ``forward`` does not take, batch by batch: transformers' ``RemoveColumnsCollator``
and the check of the first batch (the dropped columns logged in transformers' words, none accepted refused).

``data/columns.py`` decides which columns to drop and applies this to datasets and streams; ``trainer_utils`` re-exports
the collator (transformers' import path). This module imports nothing of cadence, so it sits below ``trainer_utils``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

logger = logging.getLogger(__name__)


class RemoveColumnsCollator:
    """Drop the keys the model's ``forward`` does not accept, then collate (dict datasets and streams).

    The first batch is checked: the dropped keys are logged once, and a batch with no accepted key
    left is an error naming the sample's keys and the accepted ones.

    Args:
        data_collator: the collator that gets the reduced samples.
        signature_columns: the keys to keep (the model's arguments and the label columns).
        logger: where the dropped keys are logged (default: this module's).
        model_name, description: for the messages (e.g. ``"GPT2LMHeadModel"``, ``"training"``).
    """

    def __init__(self, data_collator: Callable, signature_columns, logger: logging.Logger | None = None,
                 model_name: str | None = None, description: str | None = None):
        self.data_collator, self.keep = data_collator, set(signature_columns)
        self.logger, self.model_name, self.description = logger or globals()["logger"], model_name or "the model", description
        self.checked = False

    def __call__(self, features: list) -> Any:
        if isinstance(features[0], Mapping):
            if not self.checked:
                self.checked = True
                check_columns(list(features[0]), self.keep, self.model_name, self.description, self.logger)
            # a row that is no dict (None, text) goes on as it is: the collator names it
            features = [{k: v for k, v in f.items() if k in self.keep} if isinstance(f, Mapping) else f for f in features]
        return self.data_collator(features)


_HF_DATASET_NAMES = {"training": "Training", "evaluation": "Evaluation"}


def check_columns(columns: list[str], accepted: set[str], model_name: str, description: str | None,
                  log: logging.Logger | None = None) -> list[str]:
    """The columns to drop; logs them, and refuses a dataset with no accepted column.

    Returns:
        the names in ``columns`` that are not in ``accepted``.
    """
    dropped = [c for c in columns if c not in accepted]
    where = f" of the {description} dataset" if description else ""
    if dropped and len(dropped) == len(columns):
        raise ValueError(
            f"no column{where} is an argument of {model_name}.forward: the dataset has {sorted(columns)}, the model "
            f"accepts {sorted(accepted)}; rename the columns to the model's argument names, or set "
            "remove_unused_columns=False to pass them as they are"
        )
    if dropped:  # transformers' words, as one formatted string: tests and log filters match the message
        # transformers names its datasets "Training", "Evaluation" and "test" in this line
        names = ", ".join(dropped)
        in_set = f"in the {_HF_DATASET_NAMES.get(description, description)} set" if description else ""
        (log or logger).info(
            f"The following columns {in_set} don't have a corresponding argument in `{model_name}.forward` and have "
            f"been ignored: {names}. If {names} are not expected by `{model_name}.forward`,  you can safely ignore "
            "this message."
        )
    return dropped
