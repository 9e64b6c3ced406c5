"""One journal record, typed: what every reader hands out.

A record is a JSON object; the readers (journal/read/) parse it, check it
(:func:`~journal.record.fields.record_problem`, the one place its validity rules live) and
complete it: an envelope field a writer left out (a journal written by hand or by another
tool) gets its default here, once, so no reader downstream needs ``rec.get("step", 0)``.
The result is a plain ``dict`` (records are many: no object per record), typed as
:class:`Record` for the type checker.
"""

from __future__ import annotations

from typing import Any, TypedDict


class Record(TypedDict):
    """A journal record as the readers hand it out (docs/journal-format.md, "Envelope")."""

    v: int  # the schema version that wrote it
    seq: int  # its place in the journal, from 0, never repeated
    run_id: str | None  # the run (None: a writer that names none)
    attempt: int  # the run's attempt, from 1
    ts: float | None  # when it was written (Unix seconds; None: not said)
    event: str
    step: int  # the optimizer steps done when it was written
    epoch: int
    samples_seen: int
    data: dict[str, Any]  # the event's payload


#: What an envelope field is when a writer left it out (seq and event are never left out:
#: a line without them is no record).
ENVELOPE_DEFAULTS: dict[str, Any] = {
    "v": 1,
    "run_id": None,
    "attempt": 1,
    "ts": None,
    "step": 0,
    "epoch": 0,
    "samples_seen": 0,
}


def complete(obj: dict[str, Any]) -> Record:
    """``obj`` (a checked record) with every envelope field there: the defaults filled in
    place for those a writer left out. A writer of this project writes them all, so the
    readers call this only for a record that lacks one."""
    for name, default in ENVELOPE_DEFAULTS.items():
        if name not in obj:
            obj[name] = default
    if "data" not in obj:
        obj["data"] = {}
    return obj  # type: ignore[return-value]
