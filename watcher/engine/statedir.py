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


@dataclass(frozen=True)
class StateFiles:
    """The files of cursor ``name`` in state dir ``dir``; no symlink is followed below
    ``root`` (:func:`journal.rundir.safety.safe_dir`): the run dir, for a state dir in it
    (its ``watch/``), else the state dir itself (the user named it)."""

    dir: Path
    name: str
    root: Path

    @classmethod
    def of(cls, state_dir: Path, name: str, run_dir: Path) -> StateFiles:
        return cls(state_dir, name, run_dir if state_dir.parent == run_dir else state_dir)

    def _file(self, suffix: str) -> Path:
        return self.dir / f"{self.name}{suffix}"

    @property
    def cursor(self) -> Path:
        """What completed (watcher.engine.cursor)."""
        return self._file(".cursor.json")

    @property
    def results(self) -> Path:
        """One line per finished delivery (watcher.engine.completion)."""
        return self._file(".results.jsonl")

    @property
    def logs(self) -> Path:
        """A command's output, one file per attempt (:func:`delivery_log_name`)."""
        return self._file(".logs")

    @property
    def running(self) -> Path:
        """A marker per running command: a restarted watcher ends what a killed one left."""
        return self._file(".running")

    @property
    def scratch(self) -> Path:
        """The record and ``$ILAB_REPORT`` files of running commands."""
        return self._file(".reports")

    @property
    def jobs(self) -> Path:
        """A marker per scheduler job (``--via``), and its script and record files."""
        return self._file(".jobs")

    @property
    def lock(self) -> Path:
        """Held by the one watcher process that uses this cursor (watcher.engine.cursor)."""
        return self._file(".lock")


def delivery_log_name(d: Delivery, attempt: int) -> str:
    """The log file of ``d``'s attempt ``attempt``: a process's or a job's (``--via``)."""
    return f"{d.record['seq']:08d}-{d.hook.event}-{d.hook.short_id}-a{attempt}.log"
