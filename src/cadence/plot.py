"""``cadence plot RUN_DIR``: the curves of a run as one PNG (matplotlib, an optional extra).

The history comes from whichever of these is furthest along: ``RUN_DIR/log_history.jsonl`` (the
``jsonl`` tracker, written as the run goes), ``RUN_DIR/trainer_state.json`` (``save_state()``), the
newest ``checkpoint-*/trainer_state.json`` (also a ``transformers.Trainer`` run's). So a run still in
progress can be plotted, and so can a transformers run.

Panels, each against the optimizer step: loss (train and eval), learning rate, grad norm, then every
other evaluation metric (``eval_accuracy``, ...). Each panel is ``PANEL_INCHES`` at ``DPI``, ``COLUMNS``
per row, so the PNG's size follows from the number of panels (``figure_size``).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

COLUMNS = 2
PANEL_INCHES = (5.0, 3.5)
DPI = 100
# evaluation numbers that are about speed, not the model
_NOT_METRICS = {"eval_loss", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def load_history(run_dir: str | Path) -> tuple[list[dict[str, Any]], Path]:
    """The log history of a run and the file it came from.

    Args:
        run_dir: an ``output_dir`` (cadence's or transformers'), a ``checkpoint-N`` folder, or a
            ``trainer_state.json`` / ``log_history.jsonl`` file.
    Raises:
        FileNotFoundError: none of those files is there.
    """
    from .checkpoint_io.formats import TRAINER_STATE_NAME
    from .integrations.jsonl import LOG_HISTORY_NAME, read_log_history
    from .trainer_utils import get_last_checkpoint

    run_dir = Path(run_dir)
    if run_dir.is_file():
        candidates = [run_dir]
    else:
        candidates = [run_dir / LOG_HISTORY_NAME, run_dir / TRAINER_STATE_NAME]
        last = get_last_checkpoint(str(run_dir)) if run_dir.is_dir() else None
        if last is not None:
            candidates.append(Path(last) / TRAINER_STATE_NAME)
    found = []
    for path in candidates:
        if path.is_file():
            history = read_log_history(path) if path.suffix == ".jsonl" else _state_history(path)
            found.append((max((h.get("step", 0) for h in history), default=-1), len(history), history, path))
    if not found:
        raise FileNotFoundError(
            f"{run_dir}: no log_history.jsonl, trainer_state.json or checkpoint-*/trainer_state.json; pass a run's "
            "output_dir (report_to='jsonl' writes its history as the run goes)"
        )
    _, _, history, path = max(found, key=lambda f: (f[0], f[1]))  # the furthest along, then the fullest
    return history, path


def _state_history(path: Path) -> list[dict[str, Any]]:
    """The ``log_history`` of a ``trainer_state.json``: rows that are not objects with an integer step are skipped
    (with a warning); a file that holds no list of rows is a ValueError naming it."""
    from .trainer_state import TrainerState

    try:
        history = TrainerState.load_from_json(str(path)).log_history
    except (ValueError, TypeError, AttributeError) as error:  # not JSON, or not an object
        raise ValueError(f"{path} is not a readable trainer_state.json ({type(error).__name__}: {error})") from None
    if not isinstance(history, list):
        raise ValueError(
            f"{path}: log_history is {type(history).__name__} {str(history)[:40]!r}, not a list of logged rows; "
            "the file was not written by a Trainer (or was edited)"
        )
    rows = [h for h in history if isinstance(h, dict) and type(h.get("step", 0)) is int]
    if len(rows) < len(history):
        logger.warning("%s: %d of %d log_history rows are not objects with an integer step: skipped", path,
                       len(history) - len(rows), len(history))
    return rows


def _mathtext_safe(text: str) -> str:
    # matplotlib reads text between two $ as a formula: a metric named "eval_$acc" would stop the whole plot
    return text.replace("$", r"\$")


def output_path(out: str | Path) -> Path:
    """Where ``plot_history`` writes: ``out`` with ``.png`` added when it has no extension.

    Raises:
        ValueError: an extension matplotlib cannot write.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = Path(out)
    if not out.suffix:
        return out.with_name(out.name + ".png")  # matplotlib would add it too: the path printed is the one written
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if out.suffix[1:].lower() not in kinds:
        raise ValueError(
            f"--out={str(out)!r}: matplotlib cannot write {out.suffix!r} files; end the name with .png (or one of "
            f"{', '.join('.' + kind for kind in sorted(kinds))})"
        )
    return out


def panels(history: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, list[int], list[float]]]]]:
    """``[(title, [(label, steps, values), ...]), ...]``: what ``plot_history`` draws, in order."""

    def series(key: str) -> tuple[list[int], list[float]]:
        rows = [(h["step"], h[key]) for h in history if isinstance(h.get(key), (int, float)) and "step" in h]
        return [s for s, _ in rows], [v for _, v in rows]

    out = []
    loss = [("train", *series("loss")), ("eval", *series("eval_loss"))]
    if any(steps for _, steps, _ in loss):
        out.append(("loss", [line for line in loss if line[1]]))
    for key, title in (("learning_rate", "learning rate"), ("grad_norm", "grad norm")):
        steps, values = series(key)
        if steps:
            out.append((title, [(key, steps, values)]))
    metrics = sorted({k for h in history for k in h if k.startswith("eval_") and k not in _NOT_METRICS})
    for key in metrics:
        steps, values = series(key)
        if steps:
            out.append((key, [(key, steps, values)]))
    return out


def figure_size(n_panels: int) -> tuple[int, int]:
    """(width, height) in pixels of the PNG for ``n_panels`` panels."""
    rows = max(1, math.ceil(n_panels / COLUMNS))
    return round(COLUMNS * PANEL_INCHES[0] * DPI), round(rows * PANEL_INCHES[1] * DPI)


def plot_history(history: list[dict[str, Any]], out: str | Path, title: str = "") -> Path:
    """Draw ``history`` (``state.log_history`` rows) as one PNG at ``out``; returns its path.

    Example:
        >>> plot_history(trainer.state.log_history, "curves.png")
    """
    try:
        import matplotlib
    except ImportError:
        raise ImportError("cadence plot needs matplotlib: pip install matplotlib (or pip install 'cadence[plot]')") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = output_path(out)
    drawn = panels(history)
    if not drawn:
        raise ValueError(f"nothing to plot: the history has no loss, learning rate, grad norm or eval metric ({len(history)} rows)")
    width, height = figure_size(len(drawn))
    rows = height // round(PANEL_INCHES[1] * DPI)
    fig, axes = plt.subplots(rows, COLUMNS, figsize=(width / DPI, height / DPI), dpi=DPI, squeeze=False)
    for ax, (name, lines) in zip(axes.flat, drawn):
        for label, steps, values in lines:
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=_mathtext_safe(label))
        ax.set_title(_mathtext_safe(name))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if len(lines) > 1:
            ax.legend()
    for ax in list(axes.flat)[len(drawn):]:
        ax.axis("off")
    if title:
        fig.suptitle(_mathtext_safe(title))
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI)  # no bbox_inches="tight": the size stays figure_size's
    plt.close(fig)
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """``cadence plot``: the run's history (see ``load_history``) drawn to ``out`` (default ``RUN_DIR/training_curves.png``)."""
    history, source = load_history(run_dir)
    if out is None:
        base = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        out = base / "training_curves.png"
    logger.info("plotting %d log rows from %s", len(history), source)
    if not panels(history):  # plot_history's own error cannot say which file held nothing
        raise ValueError(f"nothing to plot in {source}: it has no loss, learning rate, grad norm or eval metric "
                         f"({len(history)} readable rows); pass a run's output_dir or its log_history.jsonl")
    return plot_history(history, out, title=str(source))
