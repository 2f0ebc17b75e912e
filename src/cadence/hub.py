"""The Hugging Face Hub: the only module that imports ``huggingface_hub`` (lazily, when a push is asked for).

With ``push_to_hub=True`` the Trainer creates the repository when it is built (a missing token or an
unreachable Hub shows before any training), then pushes by ``hub_strategy`` (transformers' meanings):

- ``end``: only ``save_model()`` / ``push_to_hub()`` push: ``output_dir`` without ``checkpoint-*`` folders;
- ``every_save``: also at every checkpoint save: the checkpoint's model files are copied into
  ``output_dir`` and ``output_dir`` is pushed ("Training in progress, step N");
- ``checkpoint``: as ``every_save``, plus the checkpoint itself into ``last-checkpoint/`` of the repo, so
  training can resume from the Hub;
- ``all_checkpoints``: as ``every_save``, with every ``checkpoint-N/`` folder pushed as it is.

Saves push in a background thread (``huggingface_hub``'s ``run_as_future``) and never wait for the
upload: training does not slow down. While a push is still running, the next save's push is skipped
unless ``hub_always_push``. A push that fails during training is logged and never raised there; the
next save pushes again (its folder holds everything the failed one had). At the end of training the
last push is waited for. A Hub that cannot be reached (``HF_HUB_OFFLINE=1``, no network) is one
``HubUnreachableError`` that says where the files are on disk: saving locally never depends on the Hub.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from .checkpoint_io import formats
from .trainer_callback import TrainerCallback
from .trainer_utils import PREFIX_CHECKPOINT_DIR, HubStrategy

logger = logging.getLogger(__name__)


class PushInProgress:
    """transformers' ``PushInProgress``: the futures of one push to the Hub (``Trainer.push_in_progress``)."""

    def __init__(self, jobs: list):
        self.jobs = jobs

    def is_done(self) -> bool:
        return all(job.done() for job in self.jobs)

    def wait_until_done(self) -> None:
        for job in self.jobs:
            job.result()

# what a checkpoint holds only to resume training: never copied into output_dir for the Hub
_RESUME_ONLY = {formats.OPTIMIZER_NAME, formats.SCHEDULER_NAME, formats.SCALER_NAME, formats.TRAINER_STATE_NAME,
                formats.LOOP_STATE_NAME, formats.STREAM_STATE_NAME}
_RNG_FILE = re.compile(r"^rng_state(_\d+)?\.pth$")
# never pushed from output_dir: private files, checkpoints being written, and (except all_checkpoints) checkpoints
_ALWAYS_IGNORED = ["_*", f"tmp-{PREFIX_CHECKPOINT_DIR}-*", f"old-{PREFIX_CHECKPOINT_DIR}-*"]


class HubUnreachableError(ConnectionError):
    """The Hub could not be reached (offline mode, no network, a wrong ``HF_ENDPOINT``); nothing was pushed."""


def _import_hub():
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError("push_to_hub needs huggingface_hub: pip install huggingface_hub (or 'cadence[hub]')") from None
    return huggingface_hub


def offline_mode() -> bool:
    """Whether downloads from the Hub are switched off (``HF_HUB_OFFLINE=1``); False without huggingface_hub."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return False
    return bool(constants.HF_HUB_OFFLINE)


def _is_unreachable(error: BaseException) -> bool:
    """Offline mode, a refused or timed-out connection, an unknown host (httpx's and the stdlib's errors)."""
    names = {"OfflineModeIsEnabled", "TransportError", "TimeoutException"}
    while error is not None:
        if isinstance(error, (ConnectionError, TimeoutError)) or names & {c.__name__ for c in type(error).__mro__}:
            return True
        error = error.__cause__ or error.__context__
    return False


def _unreachable(error: BaseException, what: str, folder: str | os.PathLike) -> HubUnreachableError:
    from huggingface_hub import constants

    offline = " (offline mode is on: HF_HUB_OFFLINE=1)" if constants.HF_HUB_OFFLINE else ""
    return HubUnreachableError(
        f"the Hugging Face Hub cannot be reached at {constants.ENDPOINT}{offline}, so {what} failed: "
        f"{type(error).__name__}: {error}. Nothing is lost: the files are saved locally in {os.path.abspath(folder)}; "
        "push them later with trainer.push_to_hub() (or `hf upload`) once the Hub can be reached"
    )


class HubRepo:
    """The repository a Trainer pushes to, and its uploads in flight.

    Args:
        args: the ``TrainingArguments`` (``hub_model_id``, ``hub_token``, ``hub_private_repo``,
            ``hub_strategy``, ``hub_always_push``, ``hub_revision``, ``output_dir``).
        token: overrides ``args.hub_token``.

    Example:
        >>> repo = HubRepo(args)      # creates the repository (exist_ok)
        >>> repo.push_checkpoint("out/checkpoint-10", step=10, epoch=1.0)
    """

    def __init__(self, args: Any, token: str | None = None):
        hub = _import_hub()
        self.args = args
        self.token = token if token is not None else args.hub_token
        self.api = hub.HfApi(token=self.token)
        name = args.hub_model_id or Path(args.output_dir).absolute().name
        try:
            self.repo_id = self.api.create_repo(name, private=args.hub_private_repo, exist_ok=True).repo_id
            if args.hub_revision:  # the branch must exist before anything is pushed to it
                self.api.create_branch(self.repo_id, branch=args.hub_revision, exist_ok=True)
        except Exception as error:
            if _is_unreachable(error):
                raise _unreachable(error, f"creating the repository {name!r}", args.output_dir) from error
            raise
        self.in_flight: list = []  # futures of the last push
        self.failed_since: str | None = None  # the commit message of the first push that failed, until one succeeds

    # -------------------------------------------------------------- during training

    def push_checkpoint(self, folder: str | os.PathLike, step: int, epoch: float | None) -> None:
        """Push after a checkpoint save, per ``hub_strategy``, in the background; never raises."""
        args, strategy = self.args, HubStrategy(self.args.hub_strategy)
        if strategy == HubStrategy.END:
            return
        self._check_last_push()
        if self.in_flight and not args.hub_always_push:
            logger.info("a push to %s is still running: this save at step %d is pushed by the next one", self.repo_id, step)
            return
        message = (f"Training in progress, step {step}" if args.save_strategy == "steps" or epoch is None
                   else f"Training in progress, epoch {int(epoch)}")
        try:
            copy_model_files(folder, args.output_dir)
            jobs = [self.upload(args.output_dir, message, blocking=False,
                                include_checkpoints=strategy == HubStrategy.ALL_CHECKPOINTS)]
            if strategy == HubStrategy.CHECKPOINT:
                jobs.append(self.upload(folder, message + ", checkpoint", blocking=False, path_in_repo="last-checkpoint"))
            self.in_flight += [(job, message) for job in jobs]  # with hub_always_push, behind those in flight
        except Exception as error:  # noqa: BLE001 - a push never stops training
            self._failed(message, error)

    def _check_last_push(self) -> None:
        """Log a failed background push (the next push sends its files again); forget finished ones."""
        if any(not job.done() for job, _ in self.in_flight):
            return
        for job, message in self.in_flight:
            if job.exception() is not None:
                self._failed(message, job.exception())
            elif self.failed_since is not None:
                logger.info("pushed to %s again after the failure of %r", self.repo_id, self.failed_since)
                self.failed_since = None
        self.in_flight = []

    def _failed(self, message: str, error: BaseException) -> None:
        self.failed_since = self.failed_since or message
        reason = "the Hub cannot be reached" if _is_unreachable(error) else "it failed"
        logger.warning("push %r to %s did not complete (%s: %s: %s); training goes on, the files are in %s and the "
                       "next save pushes them again", message, self.repo_id, reason, type(error).__name__, error,
                       os.path.abspath(self.args.output_dir))

    def wait(self) -> None:
        """Wait for the pushes in flight (end of training); a failure is logged, not raised."""
        for job, _ in self.in_flight:
            try:
                job.result()
            except Exception:  # noqa: BLE001 - logged by _check_last_push
                pass
        self._check_last_push()

    # -------------------------------------------------------------- uploads

    def upload(self, folder: str | os.PathLike, commit_message: str, blocking: bool = True, token: str | None = None,
               revision: str | None = None, path_in_repo: str | None = None, include_checkpoints: bool = False):
        """``upload_folder`` of ``folder`` (without ``checkpoint-*`` unless asked); a ``Future`` when not blocking.

        A blocking upload to a Hub that cannot be reached raises ``HubUnreachableError``.
        """
        ignore = _ALWAYS_IGNORED + ([] if include_checkpoints else [f"{PREFIX_CHECKPOINT_DIR}-*"])
        try:
            return self.api.upload_folder(
                repo_id=self.repo_id, folder_path=str(folder), path_in_repo=path_in_repo, commit_message=commit_message,
                token=token if token is not None else self.token, ignore_patterns=ignore,
                revision=revision if revision is not None else self.args.hub_revision, run_as_future=not blocking,
            )
        except Exception as error:
            if _is_unreachable(error):
                raise _unreachable(error, f"pushing {folder} to {self.repo_id}", folder) from error
            raise


def copy_model_files(checkpoint_folder: str | os.PathLike, output_dir: str | os.PathLike) -> None:
    """Put a checkpoint's model files (weights, config, tokenizer, arguments; not the resume state) into
    ``output_dir``, each file replaced atomically so an upload reading the previous one is never torn."""
    source, target = Path(checkpoint_folder), Path(output_dir)
    if source.resolve() == target.resolve():
        return
    for path in source.iterdir():
        if path.is_file() and path.name not in _RESUME_ONLY and not _RNG_FILE.match(path.name):
            tmp = target / f"_{path.name}.tmp"  # "_*" is never pushed
            shutil.copyfile(path, tmp)
            os.replace(tmp, target / path.name)


def write_model_card(output_dir: str | os.PathLike, model_name: str, args: Any, log_history: list[dict],
                     language: str | None = None, license: str | None = None, tags: str | list[str] | None = None,
                     finetuned_from: str | None = None, dataset: str | list[str] | None = None, **_: Any) -> Path:
    """A short ``README.md``: YAML metadata the Hub reads, the hyperparameters and the last evaluation."""
    tags = [tags] if isinstance(tags, str) else list(tags or [])
    meta = ["---", "library_name: cadence", *([f"language: {language}"] if language else []),
            *([f"license: {license}"] if license else []), *([f"base_model: {finetuned_from}"] if finetuned_from else []),
            "tags:", *(f"- {t}" for t in ["generated_from_trainer", *tags]),
            "model-index:", f"- name: {model_name}", "  results: []", "---"]
    datasets = [dataset] if isinstance(dataset, str) else list(dataset or [])
    lines = [*meta, "", f"# {model_name}", "",
             "This model was trained with cadence (a `transformers.Trainer`-compatible loop)"
             + (f" from [{finetuned_from}](https://huggingface.co/{finetuned_from})" if finetuned_from else "")
             + (f" on {', '.join(datasets)}" if datasets else "") + ".", "", "## Training hyperparameters", ""]
    for name in ("learning_rate", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
                 "seed", "optim", "lr_scheduler_type", "warmup_steps", "num_train_epochs", "max_steps"):
        lines.append(f"- {name}: {getattr(args, name)}")
    evals = [entry for entry in log_history if any(k.startswith("eval_") for k in entry)]
    if evals:
        lines += ["", "## Last evaluation", ""]
        lines += [f"- {k}: {v}" for k, v in evals[-1].items() if k.startswith("eval_") or k in ("epoch", "step")]
    path = Path(output_dir) / "README.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


class HubCallback(TrainerCallback):
    """Pushes after every checkpoint save (per ``hub_strategy``) and waits for the last push at the end."""

    def __init__(self, repo: HubRepo):
        self.repo = repo

    def on_save(self, args, state, control, **kwargs):
        if args.should_save:
            folder = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            self.repo.push_checkpoint(folder, state.global_step, state.epoch)

    def on_train_end(self, args, state, control, **kwargs):
        self.repo.wait()


def push_to_hub(trainer, commit_message: str, blocking: bool, token: str | None, revision: str | None, **card_kwargs):
    """The body of ``Trainer.push_to_hub``: save the model and write the model card (locally, first), then
    upload ``output_dir``."""
    args = trainer.args
    model_name = card_kwargs.pop("model_name", None)
    if model_name is None:
        model_name = args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name
    trainer.save_model(_internal_call=True)  # saved locally first: a Hub that fails loses nothing
    if not args.should_save:  # one process pushes
        return None
    if hasattr(trainer, "create_model_card"):
        trainer.create_model_card(model_name=model_name, **card_kwargs)
    else:
        write_model_card(args.output_dir, model_name, args, trainer.state.log_history, **card_kwargs)
    repo = trainer.hub_repo
    if repo is None or (token is not None and token != repo.token):
        repo = trainer.init_hf_repo(token=token)
    trainer.control = trainer.callback_handler.on_push_begin(args, trainer.state, trainer.control)
    repo.wait()  # the last checkpoint push lands first
    return repo.upload(args.output_dir, commit_message, blocking=blocking, token=token, revision=revision)
