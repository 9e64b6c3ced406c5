"""The runs a server shows: run dirs given by name, the runs under a parent dir (found again
on each look, so new runs appear), mirrored runs (a local copy kept in step). A run's page
folds its journal once and then reads on; the runs list reads each journal's index."""

from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.rundir.ledger import claims_dir
from journal.rundir.paths import JOURNAL_NAME
from journal.serve.data import STATE_MEANING, run_row
from journal.serve.fold import RunFold
from journal.views.index import summarize
from journal.views.query import find_last
from journal.views.summary import STATE_EXIT_CODES

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


@dataclass
class Run:
    """One run the server shows: its key in URLs, its dir, where it came from."""

    key: str
    dir: Path
    source: str  # as given (a dir or a store URI)
    remote: bool = False  # a mirrored run: its copy here takes no commands
    fold: RunFold | None = None
    _row: tuple[tuple[int, int, int | None], dict[str, Any]] | None = None

    @property
    def journal(self) -> Path:
        return self.dir / JOURNAL_NAME

    def opened(self) -> RunFold:
        """The run's fold, read on to the journal's end."""
        if self.fold is None:
            self.fold = RunFold(self.journal)
        self.fold.update()
        return self.fold


@dataclass
class RunSet:
    """Every run the server shows, by key."""

    sources: list[tuple[str, Path, bool]]  # (as given, local dir, remote)
    stale_after: float = 600.0
    runs: dict[str, Run] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self) -> list[Run]:
        """The runs now (a parent dir's new runs added)."""
        with self._lock:
            known = {r.dir: r for r in self.runs.values()}
            for given, path, remote in self.sources:
                for run_dir in _run_dirs(path):
                    if run_dir not in known:
                        known[run_dir] = self._add(run_dir, given, remote)
        return list(self.runs.values())

    def rows(self) -> list[dict[str, Any]]:
        """The runs list: every run's row, newest first (by start, else last record). A run
        that cannot be read is a row in the state ``error`` with the reason; the others
        are shown as ever."""
        rows = [self.row_or_error(run) for run in self.refresh()]
        return sorted(
            rows, key=lambda r: (-(r.get("started_ts") or r.get("last_ts") or 0.0), r["key"])
        )

    def get(self, key: str) -> Run | None:
        if key not in self.runs:
            self.refresh()
        return self.runs.get(key)

    def _add(self, run_dir: Path, given: str, remote: bool) -> Run:
        base = _UNSAFE.sub("_", run_dir.name) or "run"
        if remote:
            base = _UNSAFE.sub("_", given.rstrip("/").rsplit("/", 1)[-1]) or "run"
        key, n = base, 1
        while key in self.runs:
            n += 1
            key = f"{base}-{n}"
        run = self.runs[key] = Run(key, run_dir, given, remote)
        return run

    def row_or_error(self, run: Run) -> dict[str, Any]:
        """:meth:`row`, or the run's error row: one run's trouble stays in its row."""
        try:
            return self.row(run)
        except Exception as exc:  # whatever one journal does, the list stays up
            reason = unreadable(run, exc)
        row = {"key": run.key, "source": run.source, "remote": run.remote, "state": "error",
               "reason": reason, "records": 0}  # fmt: skip
        return _aged(row, time.time(), self.stale_after)

    def row(self, run: Run, now: float | None = None) -> dict[str, Any]:
        """The runs list's row of ``run``: state, step / max, throughput, ETA, best, age."""
        now = time.time() if now is None else now
        try:
            st = run.journal.stat()
        except FileNotFoundError:
            return {"key": run.key, "source": run.source, "state": "empty", "records": 0}
        ident = (st.st_size, st.st_mtime_ns, _mtime(claims_dir(run.dir)))  # a hang: no record
        if run.fold is not None:
            fold = run.opened()
            if fold.unreadable:
                raise OSError(fold.unreadable)
            truth = fold.run
        elif run._row is not None and run._row[0] == ident:
            return _aged(run._row[1], now, self.stale_after)
        else:
            truth = summarize(run.journal).fold
        s, alerts = truth.judged(stale_after=None, now=now, run_dir=run.dir)
        last_log = find_last(run.journal, "log")
        log = last_log["data"] if last_log is not None else {}
        row = {
            "key": run.key,
            "source": run.source,
            "remote": run.remote,
            **run_row(s, alerts, log),
        }
        per_step = None if row["stuck"] else log.get("elapsed_time")  # stuck: no ETA
        eta = None
        if s.state == "running" and s.total_steps and isinstance(per_step, (int, float)):
            eta = max(0, s.total_steps - s.last_step) * per_step
        row |= {"eta_s": eta, "started_ts": s.started_ts, "records": s.records}
        run._row = (ident, row)
        return _aged(row, now, self.stale_after)


def _mtime(path: Path) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def unreadable(run: Run, exc: BaseException) -> str:
    """Why a run cannot be shown, in one line."""
    if isinstance(exc, OSError) and exc.strerror:  # "Is a directory", "Permission denied"
        return f"cannot read {run.journal.name}: {exc.strerror}"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def _aged(row: dict[str, Any], now: float, stale_after: float) -> dict[str, Any]:
    """The row with its age, and a running run that has been quiet too long as stale."""
    out = dict(row)
    last = out.get("last_ts")
    out["age_s"] = None if last is None else max(0.0, now - last)
    if out.get("state") == "running" and last is not None and now - last > stale_after:
        out["state"], out["reason"] = "stale", f"no record for {now - last:.0f}s and no train_end"
        out["eta_s"] = None
    out["stale"] = out.get("state") == "stale"
    out["meaning"] = STATE_MEANING.get(out.get("state") or "", "")
    state = out.get("state") or ""
    out["exit_code"] = None if state == "error" else STATE_EXIT_CODES.get(state, 1)
    return out


def _run_dirs(path: Path) -> list[Path]:
    """``path`` itself when it is a run dir (or a journal), else the run dirs in it."""
    if path.is_file():
        return [path.parent]
    if (path / JOURNAL_NAME).exists():
        return [path]
    try:  # a journal that is not a file is a run too: shown with why it cannot be read
        return sorted(p for p in path.iterdir() if (p / JOURNAL_NAME).exists())
    except OSError:
        return []
