"""``ilab-journal plot``: loss, val_loss, reported metrics per checkpoint and learning rate
per step, as a PNG."""

from __future__ import annotations

from pathlib import Path

from journal.read.reader import iter_records


class MissingPlotExtra(RuntimeError):
    """matplotlib is not installed."""


class NothingToPlot(ValueError):
    """The journal has no log or evaluate record."""


def plot_journal(path: Path, out: Path) -> None:
    """Write the plot of the journal at ``path`` to ``out`` (needs the 'plot' extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingPlotExtra("plot needs matplotlib: pip install 'ilab-journal[plot]'") from None
    steps, losses, lrs, vsteps, vloss, saves = [], [], [], [], [], []
    reported: dict[str, list[tuple[int, float]]] = {}  # metric -> (checkpoint step, value)
    for rec in iter_records(path):
        d = rec.get("data") or {}
        if rec.get("event") == "log" and d.get("loss") is not None:
            steps.append(rec["step"])
            losses.append(d["loss"])
            lrs.append(d.get("lr"))
        elif rec.get("event") == "evaluate" and d.get("val_loss") is not None:
            vsteps.append(rec["step"])
            vloss.append(d["val_loss"])
        elif rec.get("event") == "save":
            saves.append(rec["step"])
        elif rec.get("event") == "report" and isinstance(d.get("step"), int):
            for name, value in (d.get("metrics") or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    reported.setdefault(name, []).append((d["step"], float(value)))
    # A metric that never changes (a problem count) says nothing on a plot and would squash
    # the scale of the others.
    reported = {k: v for k, v in reported.items() if len({x for _, x in v}) > 1}
    if not steps and not vsteps and not reported:
        raise NothingToPlot(f"{path}: no log, evaluate or report records to plot")
    rows = 3 if reported else 2
    fig, axes = plt.subplots(rows, 1, figsize=(8, 3 * rows), sharex=True)
    ax1, ax2 = axes[0], axes[-1]
    ax1.plot(steps, losses, label="loss")
    if vsteps:
        ax1.plot(vsteps, vloss, "o-", label="val_loss")
    for s in saves:
        ax1.axvline(s, color="grey", alpha=0.3, lw=0.8)
    ax1.set_ylabel("loss")
    ax1.legend()
    if reported:
        for name, points in sorted(reported.items()):
            points.sort()
            axes[1].plot([p[0] for p in points], [p[1] for p in points], "s-", label=name)
        axes[1].set_ylabel("reported (per checkpoint)")
        axes[1].legend()
    ax2.plot(steps, lrs, color="tab:green")
    ax2.set_ylabel("lr")
    ax2.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
