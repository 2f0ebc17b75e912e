"""``patch_transformers()``: transformers' trainer names pointed at cadence's.

Libraries such as TRL and sentence-transformers subclass ``transformers.Trainer`` and ``TrainingArguments`` inside
their own modules, so their users cannot switch an import. After ``patch_transformers()``, the public names of
transformers' trainer modules (``transformers.Trainer``, ``transformers.trainer.Trainer``,
``transformers.trainer_utils.set_seed``, ...) are cadence's objects, so every class defined afterwards subclasses
cadence. Nothing inside cadence imports this module; ``cadence run`` and users call it.

Child processes (``accelerate launch``, ``trl sft``, ``torchrun`` started by a script, spawn workers) get the patch
through the environment: ``patch_transformers()`` sets ``CADENCE_PATCH_TRANSFORMERS=1``, and ``cadence_patch.pth``
(installed beside cadence in site-packages) calls ``_startup()`` in every Python process that starts with it set
(not to one of the usual false words: ``0``, ``false``, ``no``, ``off``, empty; so a child started with
``CADENCE_PATCH_TRANSFORMERS=0`` stays on transformers). When cadence cannot be imported there (an editable install
whose folder moved), the hook prints one line saying so and the process goes on, on transformers.
``_startup()`` imports nothing of transformers: it patches each of transformers' trainer modules the moment that
module has run, so nothing can subclass transformers' classes first and a process that never trains pays nothing.

>>> import cadence
>>> cadence.patch_transformers()
>>> import transformers, trl
>>> issubclass(trl.SFTTrainer, cadence.Trainer)
True
"""

from __future__ import annotations

import importlib
import importlib.abc
import logging
import os
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
    "transformers.trainer_jit_checkpoint": "cadence.trainer_jit_checkpoint",
    "transformers.trainer_optimizer": "cadence.trainer_optimizer",
    # the schedules and Adafactor: a scheduler a script builds from transformers (GreedyLR, which steps on eval
    # metrics) must be the class cadence's Trainer knows
    "transformers.optimization": "cadence.optimization",
}
# a module that holds one of these (or a subclass it defines) was built on transformers' Trainer before the patch
_BASES = (("transformers.trainer", "Trainer"), ("transformers.training_args", "TrainingArguments"))

# module-level objects pointed at cadence's too: the default callback list a library reads to build its own handler,
# and the module's logger, so code that reads or patches `transformers.trainer.logger` (a test's
# patch("transformers.trainer.logger.warning")) sees the messages cadence logs
SHARED = ("DEFAULT_CALLBACKS", "logger")

# set: this process and its children run on cadence; off when unset or one of the usual false words ("0", "false",
# "no", "off", empty; any case, spaces trimmed), so a child opts out with CADENCE_PATCH_TRANSFORMERS=0
ENV = "CADENCE_PATCH_TRANSFORMERS"
PTH = "cadence_patch.pth"  # the start-up hook's file in site-packages (shipped in the wheel, see setup.py)

_applied: dict[str, Any] = {}  # name -> transformers' original object, once patched
_loggers_before: dict[str, Any] = {}  # the `cadence` logger's parent and level before the patch, while patched
_pairs: dict[int, tuple[Any, Any]] = {}  # the start-up hook's replacements so far, over the modules patched


def _replacements() -> dict[int, tuple[Any, Any]]:
    """``{id(transformers' object): (transformers' object, cadence's object)}`` for every public name that
    transformers defines in its trainer modules and cadence has in the module of the same role."""
    pairs: dict[int, tuple[Any, Any]] = {}
    for theirs_name in MODULES:
        try:
            theirs = importlib.import_module(theirs_name)
        except ModuleNotFoundError:  # not in the installed transformers (4.x has no trainer_jit_checkpoint)
            continue
        pairs.update(_module_replacements(theirs))
    return pairs


def _module_replacements(theirs: ModuleType) -> dict[int, tuple[Any, Any]]:
    """The replacements for the public names one of transformers' trainer modules defines itself."""
    ours = importlib.import_module(MODULES[theirs.__name__])
    pairs = {}
    for name, original in vars(theirs).items():
        if name.startswith("_") or getattr(original, "__module__", None) != theirs.__name__:
            continue  # private, a constant, or imported from elsewhere (patched where it is defined)
        try:
            replacement = getattr(ours, name)
        except AttributeError:  # transformers-only helper: transformers' own stays
            continue
        pairs[id(original)] = (original, replacement)
    return pairs


def _swap(module: ModuleType, pairs: dict[int, tuple[Any, Any]]) -> None:
    """Point ``module``'s public names that hold a replaced object at cadence's, and transformers' lazy top-level
    names that live in ``module`` too."""
    for name, value in list(vars(module).items()):
        if not name.startswith("_") and id(value) in pairs and pairs[id(value)][0] is value:
            setattr(module, name, pairs[id(value)][1])
            _applied[f"{module.__name__}.{name}"] = value
    ours = sys.modules.get(MODULES.get(module.__name__, ""))
    for name in SHARED:  # objects, not classes or functions: matched by name with cadence's module of the same role
        if name in vars(module) and hasattr(ours, name) and getattr(module, name) is not getattr(ours, name):
            _applied.setdefault(f"{module.__name__}.{name}", getattr(module, name))
            setattr(module, name, getattr(ours, name))
    top = sys.modules.get("transformers")
    submodule = module.__name__[len("transformers."):]
    for name, home in getattr(top, "_class_to_module", {}).items():  # the top level is lazy: name -> submodule
        if home == submodule and f"{module.__name__}.{name}" in _applied:
            setattr(top, name, getattr(module, name))
            _applied[f"transformers.{name}"] = _applied[f"{module.__name__}.{name}"]


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
    ``.trainer_callback``, ``.trainer_utils``, ``.trainer_pt_utils``, ``.trainer_seq2seq``,
    ``.training_args_seq2seq``, ``.trainer_jit_checkpoint``, ``.trainer_optimizer`` and ``.optimization`` (where
    the installed transformers has them), for every name cadence has (``Trainer``, ``TrainingArguments``,
    ``Seq2Seq*``, ``TrainerCallback``, ``TrainerState``, ``TrainerControl``, the callbacks, ``set_seed``,
    ``EvalPrediction``, ``get_scheduler``, ``GreedyLR``, ``Adafactor``, ...).
    Their ``DEFAULT_CALLBACKS`` and module ``logger`` objects become cadence's as well.
    cadence's loggers (``cadence``, ``cadence.*``) become children of transformers' library root logger, with no level
    of their own: transformers' verbosity, handlers and captures apply to them as to transformers' Trainer
    (``unpatch_transformers()`` puts them back).
    Calling it again does nothing. It sets ``CADENCE_PATCH_TRANSFORMERS=1`` in ``os.environ``: the Python processes
    started afterwards (launchers, workers) patch themselves at start-up, through ``cadence_patch.pth``; a
    transformers ``Trainer`` built anyway in such a process warns once. transformers' callbacks imported before it (``EarlyStoppingCallback``)
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
    for name in MODULES:
        if name in sys.modules:
            _swap(sys.modules[name], pairs)
    _adopt_loggers()
    if "transformers.trainer.Trainer" in _applied:  # not when the start-up hook has patched it already
        _warn_when_built(_applied["transformers.trainer.Trainer"], "its class was defined on transformers' Trainer "
                         "before cadence.patch_transformers() ran (a reference kept from before the patch)")
    os.environ[ENV] = "1"  # child processes (launchers, workers) patch themselves through the start-up hook
    logger.info("cadence: %d transformers trainer names now point at cadence's", len(_applied))


def unpatch_transformers() -> None:
    """Undo ``patch_transformers()`` in this process: transformers' trainer names point at transformers' own objects
    again, cadence's loggers leave transformers' logger tree (their parent and level as before the patch), the
    start-up hook stops patching modules imported from now on, and ``CADENCE_PATCH_TRANSFORMERS`` is removed, so child
    processes started afterwards run on transformers. Classes defined while patched (a library's trainer imported
    meanwhile) stay subclasses of cadence's. Calling it when not patched does nothing.

    Example:
        >>> import cadence.patch
        >>> cadence.patch.patch_transformers()
        >>> cadence.patch.unpatch_transformers()
        >>> import transformers
        >>> transformers.Trainer.__module__
        'transformers.trainer'
    """
    for key, original in reversed(list(_applied.items())):
        module_name, name = key.rsplit(".", 1)
        if module_name in sys.modules:
            setattr(sys.modules[module_name], name, original)
    trainer = sys.modules.get("transformers.trainer")
    if trainer is not None and getattr(trainer.Trainer.__init__, "_cadence_warns", False):
        trainer.Trainer.__init__ = trainer.Trainer.__init__.__wrapped__
    _applied.clear()
    _pairs.clear()
    _warned.clear()
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _PatchOnImport)]
    os.environ.pop(ENV, None)
    _release_loggers()


def _adopt_loggers() -> None:
    """Make the ``cadence`` logger a child of transformers' library root logger while patched, with no level of its
    own: cadence's Trainer then logs where transformers' Trainer logs (``transformers.trainer`` is a child of that
    root, which does not propagate to Python's root logger), so transformers' verbosity
    (``transformers.logging.set_verbosity_*``, ``TRANSFORMERS_VERBOSITY``), its handler and a handler added to it
    (``CaptureLogger(transformers.logging.get_logger())``) apply to cadence's messages as to transformers'."""
    if _loggers_before or "transformers.utils.logging" not in sys.modules:
        return
    root = sys.modules["transformers.utils.logging"].get_logger()  # configured as on transformers' first use
    ours = logging.getLogger("cadence")
    _loggers_before.update(parent=ours.parent, level=ours.level)
    ours.parent = root
    ours.setLevel(logging.NOTSET)  # also clears the loggers' cached levels, which the new parent changes


def _release_loggers() -> None:
    """Put the ``cadence`` logger back where it was before ``_adopt_loggers()``, with its level."""
    if not _loggers_before:
        return
    ours = logging.getLogger("cadence")
    ours.parent = _loggers_before.pop("parent")
    ours.setLevel(_loggers_before.pop("level"))


def is_patched() -> bool:
    """Whether ``patch_transformers()`` (or the start-up hook) has run in this process."""
    return bool(_applied)


def _warn_when_built(original: type, why: str) -> None:
    """Make transformers' own ``Trainer`` say, once, that it is being built in a process asked to run on cadence."""
    init = original.__init__
    if getattr(init, "_cadence_warns", False):
        return

    def __init__(self, *args, **kwargs):
        if not _warned:
            _warned.append(type(self))
            cls = type(self)
            warnings.warn(
                f"cadence: this process was asked to train on cadence ({ENV}=1) but builds "
                f"{cls.__module__}.{cls.__qualname__}, a subclass of transformers' Trainer: {why}. It trains on "
                "transformers. Run it with `cadence run` (or call cadence.patch_transformers() before importing the "
                "library that defines it).", RuntimeWarning, stacklevel=2)
        init(self, *args, **kwargs)

    __init__._cadence_warns = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = init  # type: ignore[attr-defined]  # what unpatch_transformers() puts back
    original.__init__ = __init__  # type: ignore[method-assign]


_warned: list[type] = []  # the class already warned about: one warning a process


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """The start-up hook's finder: it lets transformers' trainer modules load as usual and patches each one the moment
    it has run, before the module that imported it reads a name from it."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in MODULES:
            return None
        for finder in sys.meta_path:  # the spec the rest of the import system would give
            if finder is not self and hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
        else:
            return None
        self.loaders = {**getattr(self, "loaders", {}), fullname: spec.loader}
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        loader = self.loaders.pop(module.__name__)
        module.__spec__.loader = module.__loader__ = loader  # the module keeps its own loader (get_source, ...)
        loader.exec_module(module)
        try:
            if module.__name__ == "transformers.trainer":
                _warn_when_built(module.Trainer, "its class was defined on transformers' Trainer before the patch")
            _pairs.update(_module_replacements(module))
            _swap(module, _pairs)
            _adopt_loggers()
        except Exception as error:  # the import itself must not fail: say loudly that this process is on transformers
            trainer = sys.modules.get("transformers.trainer")
            warnings.warn(f"cadence: the start-up hook could not patch {module.__name__} ({error!r}); this process "
                          "trains on transformers", RuntimeWarning)
            if trainer is not None:
                _warn_when_built(trainer.Trainer, f"patching {module.__name__} failed ({error!r})")


def _startup() -> None:
    """Called by ``cadence_patch.pth`` at interpreter start-up when ``CADENCE_PATCH_TRANSFORMERS`` is set: patch
    transformers' trainer modules as they are imported (nothing is imported now)."""
    if "transformers.trainer" in sys.modules:  # imported before site-packages' hooks ran (a sitecustomize)
        patch_transformers()
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def hook_installed() -> bool:
    """Whether ``cadence_patch.pth`` lies in a site-packages folder of this interpreter, so that Python child
    processes of a patched run patch themselves."""
    import site

    folders = [*site.getsitepackages(), site.getusersitepackages()] if hasattr(site, "getsitepackages") else []
    return any(os.path.exists(os.path.join(folder, PTH)) for folder in folders)


__all__ = ["is_patched", "patch_transformers", "unpatch_transformers"]
