"""The names a ``check`` expression may use (the facts, the metric functions, the words a
string fact can be) and, for a name that is none of them, the closest one: a typo is told
as such (``did you mean 'status'?``), never read as a string that quietly passes."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from journal.views.stops import STOP_KINDS
from journal.views.summary import STATE_EXIT_CODES

#: Facts of a run: name -> (type, what it is). Types: "num" or "str".
FACTS: dict[str, tuple[str, str]] = {
    "status": ("str", "the run's state, as status prints it (completed, stopped, ...)"),
    "steps": ("num", "the last step reached"),
    "max_steps": ("num", "the steps the run planned (train_begin's total_steps)"),
    "epoch": ("num", "the last epoch"),
    "samples": ("num", "samples seen"),
    "records": ("num", "valid records in the journal"),
    "invalid_lines": ("num", "lines that are not valid records"),
    "reports": ("num", "report records of the run"),
    "refused_reports": ("num", "report files refused when journaled"),
    "unapplied_commands": ("num", "commands that arrived after the run ended"),
    "stop_source": ("str", "who stopped it: eval, early_stopping, callback, operator, ..."),
    "stopped_by": ("str", "the stopping command's source string"),
    "stop_reason": ("str", "train_end's reason"),
    "run_id": ("str", "the run's id"),
    "attempt": ("num", "the attempt (1 + resumes)"),
    "alerts": ("num", "alerts a watcher raised for the run (docs/alerts.md)"),
}
#: The words a string fact can be: any other is a typo, and ``status != completd`` would
#: always hold, so it is refused like a misspelt fact.
VOCABULARY: dict[str, tuple[str, ...]] = {
    "status": tuple(STATE_EXIT_CODES),
    "stop_source": STOP_KINDS,
}
#: Functions of a metric (reported, evaluate or log fields): name -> what they give.
FUNCTIONS: dict[str, str] = {
    "best": "the best value (the run's keep_best direction, else min for *loss*, max else)",
    "last": "the newest value",
    "first": "the oldest value",
    "min": "the smallest value",
    "max": "the largest value",
    "reports": "how many reports carry it",
    "count": "how many values there are (reports, evaluate and log records)",
}


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to ``name`` (a typo's intent), or None when none is close."""
    got = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return got[0] if got else None


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'status'?)``, or empty when no known name is close."""
    near = closest(name, known)
    return f" (did you mean {near!r}?)" if near else ""


def unknown_metric(ref: str, metric: str, known: Iterable[str]) -> str:
    """The line for a metric function naming a metric the run never had: names it, and the
    closest metric the run has (else a few of them, so the user sees what there is)."""
    names = sorted(set(known))
    hint = did_you_mean(metric, names)
    if not hint:
        shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
        hint = f" (its metrics: {shown})" if names else " (it has none)"
    return f"{ref}: the run has no metric {metric!r}{hint}"
