"""``ilab-journal plot``: loss, val_loss, reported metrics per checkpoint and learning rate
per step, as a PNG, with the run's story marked as on ``ilab-journal serve``'s page: saves
(kept, removed, best), commands (stop and others, who sent them), resumed attempts, the end;
titled with the run id, its status and reason."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.record.fields import accepted
from journal.rundir.paths import checkpoint_key
from journal.serve.fold import REPORTED, RunFold
from journal.views.fold import CheckpointView

#: How each mark is drawn: (colour, line style, line width).
MARK_STYLES: dict[str, tuple[str, str, float]] = {
    "kept": ("tab:blue", "-", 0.8),
    "removed": ("grey", ":", 0.8),
    "best": ("goldenrod", "-", 2.2),
    "command": ("tab:red", "-", 1.4),
    "attempt": ("black", "--", 1.0),
    "end": ("saddlebrown", "-", 1.4),
}


#: Which line is on top where marks meet (a stop's step is often the best's and the end's).
_Z = {"removed": 1, "kept": 1, "attempt": 2, "end": 2, "best": 3, "command": 4}


class MissingPlotExtra(RuntimeError):
    """matplotlib is not installed."""


class NothingToPlot(ValueError):
    """The journal has no log or evaluate record."""


@dataclass
class Mark:
    """A vertical line on every panel: ``kind`` picks its style (MARK_STYLES)."""

    step: int
    kind: str
    label: str


@dataclass
class PlotStory:
    """What the plot shows: its title, curves (name -> steps, values) and marks."""

    title: str
    curves: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    marks: list[Mark] = field(default_factory=list)


def checkpoint_marks(views: Iterable[CheckpointView]) -> dict[str, str]:
    """How each checkpoint of the run's fold is marked, by its key
    (:func:`~journal.rundir.paths.checkpoint_key`): ``best`` (the run's keep_best), ``removed``
    (journaled as removed, or gone from disk without a record), else ``kept``. Pure: the
    differential test compares it with the fold."""
    return {v.fate.key: "best" if v.best else "kept" if v.on_disk else "removed" for v in views}


def story(path: Path) -> PlotStory:
    """The journal at ``path`` read once into what :func:`plot_journal` draws."""
    fold = RunFold(path)
    fold.update()
    fold.close()
    s = fold.run.summary()
    title = f"run {s.run_id or '?'} (attempt {s.attempt or '?'}): {s.state}"
    if s.reason:
        title += f": {s.reason}"
    out = PlotStory(title[:160])
    for name, series in fold.series.items():
        if name in ("loss", "val_loss", "lr") or (
            name.startswith(REPORTED) and len(set(series.values)) > 1
        ):  # a reported metric that never changes (a problem count) would squash the scale
            out.curves[name] = (list(series.steps), list(series.values))
    fates = checkpoint_marks(fold.run.checkpoints())
    for m in fold.markers:
        step, d = m["step"], m["detail"]
        if step is None:
            continue
        if m["kind"] == "save":
            saved = str(d.get("checkpoint_path"))
            kind = fates.get(checkpoint_key(saved), "kept")
            out.marks.append(Mark(step, kind, f"{kind} {Path(saved).name}"))
        elif m["kind"] == "control" and d.get("command"):
            verdict = "applied" if accepted(d) else "refused"
            out.marks.append(Mark(step, "command", f"{d['command']} {verdict} ({d.get('source')})"))
        elif m["kind"] == "attempt" and d.get("resumed_from"):
            out.marks.append(Mark(step, "attempt", f"attempt {d.get('attempt')} resumed"))
        elif m["kind"] == "end":
            out.marks.append(Mark(step, "end", f"end: {d.get('status')}"))
    if not any(k in out.curves for k in ("loss", "val_loss")) and len(out.curves) <= 1:
        raise NothingToPlot(f"{path}: no log, evaluate or report records to plot")
    return out


def plot_journal(path: Path, out: Path) -> None:
    """Write the plot of the journal at ``path`` to ``out`` (needs the 'plot' extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingPlotExtra("plot needs matplotlib: pip install 'ilab-journal[plot]'") from None
    st = story(path)
    reported = sorted(k for k in st.curves if k.startswith(REPORTED))
    rows = 3 if reported else 2
    fig, axes = plt.subplots(rows, 1, figsize=(9, 3 * rows + 0.6), sharex=True)
    ax1, ax2 = axes[0], axes[-1]
    for name, style in (("loss", "-"), ("val_loss", "o-")):
        if name in st.curves:
            ax1.plot(*st.curves[name], style, label=name, ms=3)
    ax1.set_ylabel("loss")
    if reported:
        for name in reported:
            axes[1].plot(*st.curves[name], "s-", label=name[len(REPORTED) :])
        axes[1].set_ylabel("reported (per checkpoint)")
        axes[1].legend(loc="best", fontsize=8)
    if "lr" in st.curves:
        ax2.plot(*st.curves["lr"], color="tab:green")
    ax2.set_ylabel("lr")
    ax2.set_xlabel("step")
    _draw_marks(axes, st.marks)
    for kind in dict.fromkeys(m.kind for m in st.marks):  # one legend entry per kind
        color, ls, lw = MARK_STYLES[kind]
        ax1.plot([], [], color=color, ls=ls, lw=lw, label=kind)
    ax1.legend(loc="upper center", fontsize=8, ncol=4)
    fig.suptitle(st.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def _draw_marks(axes: Any, marks: list[Mark]) -> None:
    """Each mark as a vertical line on every panel, its label at the top of the first
    (commands, resumes and the end; saves are many, their kind is in the legend)."""
    labelled: dict[int, int] = {}  # labels already at a step: the next one goes left of them
    for mark in marks:
        color, ls, lw = MARK_STYLES[mark.kind]
        for ax in axes:
            ax.axvline(mark.step, color=color, ls=ls, lw=lw, alpha=0.8, zorder=_Z[mark.kind])
        if mark.kind in ("command", "attempt", "end", "best"):
            shift = labelled.get(mark.step, 0)
            labelled[mark.step] = shift + 1
            axes[0].annotate(
                mark.label[:60],
                xy=(mark.step, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(-9 * shift - 2, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                ha="right",
                fontsize=7,
                color=color,
            )
