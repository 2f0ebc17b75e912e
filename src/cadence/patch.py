"""``patch_transformers()``: transformers' trainer names pointed at cadence's.

Libraries such as TRL and sentence-transformers subclass ``transformers.Trainer`` and ``TrainingArguments`` inside
their own modules, so their users cannot switch an import. After ``patch_transformers()``, the public names of
transformers' trainer modules (``transformers.Trainer``, ``transformers.trainer.Trainer``,
``transformers.trainer_utils.set_seed``, ...) are cadence's objects, so every class defined afterwards subclasses
cadence. Nothing inside cadence imports this module; ``cadence run`` and users call it.

>>> import cadence
>>> cadence.patch_transformers()
>>> import transformers, trl
>>> issubclass(trl.SFTTrainer, cadence.Trainer)
True
"""

from __future__ import annotations

import importlib
import logging
import sys
import warnings
from types import ModuleType
from typing import Any

logger = logging.getLogger(__name__)

# transformers' module -> cadence's module with the same public names
MODULES = {
    "transformers.trainer": "cadence.trainer",
    "transformers.training_args": "cadence.training_args",
    "transformers.trainer_callback": "cadence.trainer_callback",
    "transformers.trainer_utils": "cadence.trainer_utils",
    "transformers.trainer_pt_utils": "cadence.trainer_pt_utils",
    "transformers.trainer_seq2seq": "cadence.trainer_seq2seq",
    "transformers.training_args_seq2seq": "cadence.training_args_seq2seq",
}
# a module that holds one of these (or a subclass it defines) was built on transformers' Trainer before the patch
_BASES = (("transformers.trainer", "Trainer"), ("transformers.training_args", "TrainingArguments"))

_applied: dict[str, Any] = {}  # name -> transformers' original object, once patched


def _replacements() -> dict[int, tuple[Any, Any]]:
    """``{id(transformers' object): (transformers' object, cadence's object)}`` for every public name that
    transformers defines in its trainer modules and cadence has in the module of the same role."""
    pairs: dict[int, tuple[Any, Any]] = {}
    for theirs_name, ours_name in MODULES.items():
        theirs, ours = importlib.import_module(theirs_name), importlib.import_module(ours_name)
        for name, original in vars(theirs).items():
            if name.startswith("_") or getattr(original, "__module__", None) != theirs_name:
                continue  # private, a constant, or imported from elsewhere (patched where it is defined)
            try:
                replacement = getattr(ours, name)
            except AttributeError:  # transformers-only helper: transformers' own stays
                continue
            pairs[id(original)] = (original, replacement)
    return pairs


def _modules_built_on_transformers(pairs: dict[int, tuple[Any, Any]]) -> list[str]:
    """The modules outside transformers and cadence that hold transformers' Trainer or TrainingArguments, or a class
    subclassing one of them: they were imported before the patch and keep transformers' classes."""
    bases = tuple(pairs[id(getattr(sys.modules[m], n))][0] for m, n in _BASES if id(getattr(sys.modules[m], n)) in pairs)
    found = []
    with warnings.catch_warnings():  # isinstance() on some deprecated module aliases (reduce_op) warns
        warnings.simplefilter("ignore")
        for module_name, module in list(sys.modules.items()):
            if _holds_any(module_name, module, bases):
                found.append(module_name)
    return sorted(found)


def _holds_any(module_name: str, module: Any, bases: tuple[type, ...]) -> bool:
    if not isinstance(module, ModuleType) or module_name.split(".")[0] in ("transformers", "cadence"):
        return False
    for value in list(vars(module).values()):
        if isinstance(value, type) and (any(value is base for base in bases)
                                        or (vars(value).get("__module__") == module_name
                                            and issubclass(value, bases))):
            return True
    return False


def patch_transformers() -> None:
    """Point the public names of transformers' trainer modules at cadence's, so classes defined afterwards
    (TRL's trainers and configs, sentence-transformers' trainers, a script's own subclass) are built on cadence.

    Patched: ``transformers.<name>`` at the top level and in ``transformers.trainer``, ``.training_args``,
    ``.trainer_callback``, ``.trainer_utils``, ``.trainer_pt_utils``, ``.trainer_seq2seq`` and
    ``.training_args_seq2seq``, for every name cadence has (``Trainer``, ``TrainingArguments``, ``Seq2Seq*``,
    ``TrainerCallback``, ``TrainerState``, ``TrainerControl``, the callbacks, ``set_seed``, ``EvalPrediction``, ...).
    Calling it again does nothing. transformers' callbacks imported before it (``EarlyStoppingCallback``)
    still work as callbacks: the callback handler calls any object's ``on_*`` methods.

    Raises:
        RuntimeError: a module outside transformers (``trl.trainer.sft_trainer``, a script's ``__main__``) already
            holds transformers' ``Trainer``/``TrainingArguments`` or a subclass; the message names the modules.

    Example:
        >>> import cadence
        >>> cadence.patch_transformers()
        >>> from trl import SFTTrainer  # now a subclass of cadence.Trainer
    """
    if _applied:
        return
    pairs = _replacements()
    early = _modules_built_on_transformers(pairs)
    if early:
        raise RuntimeError(
            f"cadence.patch_transformers() was called after {', '.join(early)} had been imported: "
            f"{'these modules hold' if len(early) > 1 else 'this module holds'} transformers' Trainer or "
            "TrainingArguments (or a subclass) and would keep training on transformers. Call "
            "cadence.patch_transformers() before importing them (first thing in the script), or run the script "
            "with `cadence run SCRIPT` / `cadence run -m MODULE`.")
    import transformers

    targets = [importlib.import_module(name) for name in MODULES]
    for module in targets:
        for name, value in list(vars(module).items()):
            if not name.startswith("_") and id(value) in pairs and pairs[id(value)][0] is value:
                setattr(module, name, pairs[id(value)][1])
                _applied[f"{module.__name__}.{name}"] = value
    lazy_names = getattr(transformers, "_class_to_module", {})  # the top level is a lazy module: name -> submodule
    for name, submodule in lazy_names.items():
        patched = f"transformers.{submodule}.{name}"
        if patched in _applied:
            setattr(transformers, name, getattr(sys.modules[f"transformers.{submodule}"], name))
            _applied[f"transformers.{name}"] = _applied[patched]
    logger.info("cadence: %d transformers trainer names now point at cadence's", len(_applied))


def is_patched() -> bool:
    """Whether ``patch_transformers()`` has run in this process."""
    return bool(_applied)


__all__ = ["is_patched", "patch_transformers"]
