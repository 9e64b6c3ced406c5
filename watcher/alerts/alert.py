"""An alert: what went wrong with a run, where, and where its evidence lies.

Detectors (a hang, a death, a failed or diverged run, a user's ``--notify-when``
condition) make an :class:`Alert` and hand it to an :class:`AlertSink`; the sink journals
it as an ``alert`` record and tells the ``--notify`` targets. Evidence files go under
``<run>/alerts/<alert-id>/`` (:func:`evidence_dir`), written before the alert is raised.
An alert's :attr:`~Alert.identity` is claimed in the run's ledger (journal/rundir/ledger.py)
before anything is sent: one notification and one record per incident, whoever raises it.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from journal.record.events import AlertKind
from journal.rundir.ledger import identity
from journal.rundir.paths import ALERTS_DIR_NAME


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
    host), said in the alert rather than holding it back. ``incident``: which one of its
    kind in the attempt (a hang: when its quiet began; a stopped guard: its host and pid);
    ``resolves``: a recovery's hang alert id."""

    kind: AlertKind
    message: str
    step: int | None
    attempt: int | None = None
    evidence: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    condition: str | None = None
    id: str = field(default_factory=new_alert_id)
    run_id: str | None = None
    incident: str | None = None
    resolves: str | None = None

    @property
    def identity(self) -> str:
        """What makes two alerts the same: its run, attempt, kind and incident (a
        ``--notify-when`` condition's text is one), as its claim's name in the ledger."""
        incident = self.incident
        if self.condition is not None:
            incident = hashlib.blake2s(self.condition.encode(), digest_size=8).hexdigest()
        return identity(self.run_id, self.attempt, self.kind, incident)


class AlertSink(Protocol):
    """Where detectors hand their alerts. ``raise_alert`` never blocks on a target and
    never raises for an unreachable one: it journals, then notifies in the background."""

    def raise_alert(self, alert: Alert) -> None: ...

    def repeats(self, alert: Alert) -> bool:
        """Whether ``raise_alert`` would drop ``alert`` as a repeat: asked before anything
        costly (a hang's evidence) is gathered for it."""
        ...
