"""What the page marks on the step axis, and how each mark looks: one table for the strip
of markers, the lines across the charts, the legend and docs/serve.md (a test holds the doc
to it). The page reads it from ``/api/config``; it names no colour of its own.

A new kind of marker is one entry in :data:`MARKER_KINDS` (the event it comes from) and one
in :data:`MARKER_STYLE` (its look); nothing else changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Events drawn as markers on the step axis, and the marker kind each is shown as.
MARKER_KINDS: dict[str, str] = {
    **{event: event for event in ("save", "evaluate", "report", "control", "job", "alert")},
    "train_begin": "attempt",
    "checkpoint_removed": "removed",
    "checkpoint_kept": "kept",
    "journal_gap": "gap",
    "train_end": "end",
}

#: The strip's rows, top to bottom: one per kind of thing, so marks at one step never hide
#: each other (five removals and the best save at step 40 are two marks, in two rows).
ROWS = ("alerts", "saves", "removals", "evals", "reports", "jobs", "commands", "run")


@dataclass(frozen=True)
class MarkStyle:
    """How a marker kind (or a save's fate) is drawn: ``color`` (CSS), ``name`` (the
    colour's word, for the docs), ``label`` (the legend's), the strip ``row``, ``line``:
    also a line across every chart, ``z``: among marks at one step, the highest is drawn
    on top (and names the group), ``dash``: a dashed line."""

    color: str
    name: str
    label: str
    row: str
    line: bool = False
    z: int = 0
    dash: bool = False


MARKER_STYLE: dict[str, MarkStyle] = {
    "save": MarkStyle("#1f77b4", "blue", "save", "saves", line=True, z=4),
    "removed": MarkStyle("#616161", "dark grey", "checkpoint removed", "removals", z=1),
    "kept": MarkStyle("#3f51b5", "indigo", "checkpoint kept (removal refused)", "removals", z=2),
    "evaluate": MarkStyle("#43a047", "green", "evaluate (val_loss)", "evals", z=3),
    "report": MarkStyle("#8e24aa", "purple", "report (a result)", "reports", z=3),
    "job": MarkStyle("#f57c00", "orange", "scheduler job", "jobs", z=3),
    "control": MarkStyle("#e53935", "red", "command", "commands", line=True, z=5),
    "gap": MarkStyle("#ec407a", "pink", "journal gap", "commands", line=True, z=4),
    "attempt": MarkStyle("#000000", "black", "attempt start", "run", line=True, z=5),
    "end": MarkStyle("#6d4c41", "brown", "train_end", "run", line=True, z=6),
    "alert": MarkStyle(
        "#d50000", "crimson", "alert (hang, died, failed, ...)", "alerts", line=True, z=8
    ),
}

#: A save's checkpoint as it stands now (the run's one fold, the leases held now): the
#: save's mark and line take the fate's look. The best is drawn above the others.
SAVE_FATES: dict[str, MarkStyle] = {
    "on_disk": MarkStyle("#1f77b4", "blue", "save, on disk", "saves", line=True, z=4),
    "leased": MarkStyle("#00a0a0", "teal", "save, leased now", "saves", line=True, z=5),
    "removed": MarkStyle(
        "#b0b0b0", "light grey, dashed", "save, removed since", "saves", line=True, z=3, dash=True
    ),
    "best": MarkStyle("#e6b400", "gold", "save, the best", "saves", line=True, z=7),
}


def style_table() -> dict[str, Any]:
    """The table as the page reads it (``/api/config``)."""
    return {
        "rows": list(ROWS),
        "kinds": {k: asdict(s) for k, s in MARKER_STYLE.items()},
        "fates": {k: asdict(s) for k, s in SAVE_FATES.items()},
    }
