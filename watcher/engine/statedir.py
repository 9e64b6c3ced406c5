"""The names of a watcher's state files: the one place for them (as journal/rundir/paths.py
is for a run dir's).

One cursor ``name`` in one state dir (``--state-dir``, by default ``<run>/watch``) owns
``<name>.*``: its cursor, results file, delivery logs, running markers, scratch files,
job markers (``--via``) and the lock that keeps it to one watcher process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from watcher.hooks.delivery import Delivery


class _File:
    """A state file of a cursor: ``<name><suffix>`` in its state dir."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, files: StateFiles, _owner: type | None = None) -> Path:
        return files.dir / f"{files.name}{self.suffix}"


@dataclass(frozen=True)
class StateFiles:
    """The files of cursor ``name`` in state dir ``dir``; no symlink is followed below
    ``root`` (:func:`journal.rundir.safety.safe_dir`): the run dir, for a state dir in it
    (its ``watch/``), else the state dir itself (the user named it)."""

    dir: Path
    name: str
    root: Path

    #: What completed (watcher.engine.cursor).
    cursor = _File(".cursor.json")
    #: One line per finished delivery (watcher.engine.completion).
    results = _File(".results.jsonl")
    #: A command's output, one file per attempt (:func:`delivery_log_name`).
    logs = _File(".logs")
    #: A marker per running command: a restarted watcher ends what a killed one left.
    running = _File(".running")
    #: The record and ``$ILAB_REPORT`` files of running commands.
    scratch = _File(".reports")
    #: A marker per scheduler job (``--via``), and its script and record files.
    jobs = _File(".jobs")
    #: Held by the one watcher process that uses this cursor (watcher.engine.cursor).
    lock = _File(".lock")

    @classmethod
    def of(cls, state_dir: Path, name: str, run_dir: Path) -> StateFiles:
        return cls(state_dir, name, run_dir if state_dir.parent == run_dir else state_dir)


def delivery_log_name(d: Delivery, attempt: int) -> str:
    """The log file of ``d``'s attempt ``attempt``: a process's or a job's (``--via``)."""
    return f"{d.record['seq']:08d}-{d.hook.event}-{d.hook.short_id}-a{attempt}.log"
