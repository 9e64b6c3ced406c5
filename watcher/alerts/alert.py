"""An alert: what went wrong with a run, where, and where its evidence lies.

Detectors (a hang, a death, a failed or diverged run, a user's ``--notify-when``
condition) make an :class:`Alert` and hand it to an :class:`AlertSink`; the sink journals
it as an ``alert`` record and tells the ``--notify`` targets. Evidence files go under
``<run>/alerts/<alert-id>/`` (:func:`evidence_dir`), written before the alert is raised.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Protocol

from journal.rundir.paths import ALERTS_DIR_NAME

#: What an alert is about. ``condition``: a user's ``--notify-when`` expression held.
AlertKind = Literal["hang", "died", "failed", "diverged", "stopped", "completed", "condition"]
ALERT_KINDS: tuple[str, ...] = AlertKind.__args__  # type: ignore[attr-defined]


def new_alert_id() -> str:
    """A unique, time-ordered alert id (also the name of its evidence directory)."""
    return f"{time.time_ns():x}-{uuid.uuid4().hex[:8]}"


def evidence_dir(run_dir: Path, alert_id: str) -> Path:
    """Where an alert's evidence files live: ``<run>/alerts/<alert-id>/``."""
    return run_dir / ALERTS_DIR_NAME / alert_id


@dataclass(frozen=True)
class Alert:
    """One alert. ``evidence``: paths relative to the run dir; ``missing``: one line per
    piece of evidence that could not be captured (ptrace refused, a rank on another
    host), said in the alert rather than holding it back."""

    kind: AlertKind
    message: str
    step: int | None
    attempt: int | None = None
    evidence: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    condition: str | None = None
    id: str = field(default_factory=new_alert_id)


class AlertSink(Protocol):
    """Where detectors hand their alerts. ``raise_alert`` never blocks on a target and
    never raises for an unreachable one: it journals, then notifies in the background."""

    def raise_alert(self, alert: Alert) -> None: ...

    def repeats(self, alert: Alert) -> bool:
        """Whether ``raise_alert`` would drop ``alert`` as a repeat: asked before anything
        costly (a hang's evidence) is gathered for it."""
        ...
