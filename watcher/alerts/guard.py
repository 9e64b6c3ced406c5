"""The guard: a thread that watches one run for hangs and deaths, raises their alerts with
the evidence, and on ``--on-hang abort`` ends the hung attempt.

No record arrives while a run hangs, so the guard looks on a clock (every ``tick_s``): it
reads the journal's new records into an :class:`AttemptTracker`, the trainer's declared
phase (journal/rundir/phase.py) and the run's processes (:class:`ProcessView`), and asks
the pure rules :func:`watcher.alerts.hang.check` and
:func:`watcher.alerts.died.check_died`. ``ilab-watch --hang-after`` runs one beside its
hooks; ``run_training`` (``ilab-train --hang-after``) runs one in the launcher, which
knows its torchrun agent and writes the aborted attempt's ``train_end``
(:func:`hang_end_payload`, found through :func:`find_abort`).

Each hang is an incident of its own (its identity: when its quiet began), claimed once
whoever sees it (journal/rundir/ledger.py); one that steps end is told as ``recovered``,
and a new one less than :data:`PAGE_EVERY_S` after the attempt's last waits, so a flapping
rank pages at most once a minute. The guard's heartbeat in the ledger says when it last
looked; an ``ilab-watch``'s guard that stops while its run goes on says so in one alert.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import orjson

from journal import store
from journal.rundir.files import atomic_write
from journal.rundir.ledger import GUARD_STALE_S, beat, claims, guards, unbeat
from journal.rundir.lock import JournalLocked, run_holder
from journal.rundir.paths import journal_path
from journal.rundir.phase import read_phase
from journal.rundir.procs import start_time, stat_fields
from watcher.alerts.alert import Alert, AlertSink, evidence_dir, new_alert_id
from watcher.alerts.died import check_died
from watcher.alerts.evidence import collect, stuck
from watcher.alerts.hang import AttemptTracker, HangFinding, HangRule, check
from watcher.alerts.processes import Proc, ProcessView

log = logging.getLogger("watcher")

OnHang = Literal["report", "abort"]
ON_HANG: tuple[str, ...] = ("report", "abort")
TICK_S = 1.0
#: Seconds between SIGTERM and SIGKILL of an aborted attempt's ranks. A rank blocked in a
#: collective runs no Python signal handler and a stopped one takes no signal but SIGKILL:
#: TERM is the courtesy, KILL the end.
TERM_GRACE_S = 2.0
KILL_WAIT_S = 10.0
ABORT_FILE = "abort.json"
#: A new hang of an attempt waits this long after its last one (a flapping rank).
PAGE_EVERY_S = 60.0
#: Seconds between two heartbeats of a guard (journal/rundir/ledger.py).
BEAT_S = 5.0


@dataclass(frozen=True)
class GuardOptions:
    """``hang``: the rule (None: no hang detection); ``on_hang``: what a hang does;
    ``deaths``: report attempts whose processes are all gone without a ``train_end``;
    ``relaunch``: what the launcher does once the attempt failed, as a hang alert says it,
    given whether the attempt saved a checkpoint (None: not known here, an ``ilab-watch``)."""

    hang: HangRule | None = None
    on_hang: OnHang = "report"
    deaths: bool = False
    relaunch: Callable[[bool], str] | None = None
    tick_s: float = TICK_S
    term_grace_s: float = TERM_GRACE_S


class Guard:
    """Watches the run in ``run_dir`` (see the module doc).

    Args:
        run_dir: the run's checkpoint dir.
        sink: where alerts go (journaled and notified: ``watcher.alerts.sink``).
        options: what to watch for and do.
        start: where in the journal to begin (a launcher: the size at launch).
        launcher_pids: role -> pid of processes of the launch known to the caller (the
            launcher and its torchrun agent); without, the run lock names the launcher.
        source: who aborts, journaled in the aborted attempt's ``train_end``.
    """

    def __init__(
        self,
        run_dir: Path,
        sink: AlertSink,
        options: GuardOptions,
        *,
        start: store.Cursor = store.START,
        launcher_pids: dict[str, int] | None = None,
        source: str | None = None,
    ) -> None:
        self.dir, self.sink, self.options = run_dir, sink, options
        self.journal = journal_path(run_dir)
        self.reader: Any = None
        self.start_cursor = start
        self.launcher_pids = launcher_pids  # the caller may fill it later (its agent's pid)
        self.host, self.pid = os.uname().nodename, os.getpid()
        self.source = source or f"watcher:{self.host}:{self.pid}"
        self.tracker = AttemptTracker()
        self.view = ProcessView()
        self.raised: set[tuple[Any, ...]] = set()  # the attempts it tried to abort
        self.launcher_seen = False
        self.saved = False  # the current attempt saved a checkpoint (what follows a hang)
        self.started_at, self._beat_at = time.time(), 0.0
        self._progress_seen: float | None = -1.0  # the progress the last recovery look saw
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread --------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ilab-guard", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop looking (an alert being raised or an abort under way finishes first); its
        heartbeat goes, and an ``ilab-watch``'s guard whose run goes on says so."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            unbeat(self.dir, self.host, self.pid)
            if self.launcher_pids is None:  # a launcher's guard stops with its launch
                self._say_stopped()
        if self.reader is not None:
            self.reader.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # the guard must outlive a bad tick: say it, look again
                log.exception("hang/death guard: a look at the run failed")
            if time.time() - self._beat_at >= BEAT_S:
                self._beat()
            self._stop.wait(self.options.tick_s)

    def _beat(self) -> None:
        """This guard's heartbeat: who it is, what it watches, when it last looked."""
        self._beat_at, hang = time.time(), self.options.hang
        info: dict[str, Any] = {"source": getattr(self.sink, "source", self.source)}
        watches = [f"hangs (--hang-after {hang.describe()})"] if hang is not None else []
        info["watches"] = ", ".join(watches + ["deaths"] * self.options.deaths)
        info |= {"run_id": self.tracker.run_id, "attempt": self.tracker.attempt}
        info |= {"started_at": self.started_at, "looked_at": self._beat_at}
        beat(self.dir, self.host, self.pid, info)

    def _say_stopped(self) -> None:
        """One ``guard_stopped`` alert when this guard ends while its run goes on: its
        attempt has not ended and a rank here is alive (or, ranks elsewhere, a launcher
        holds the run dir)."""
        with contextlib.suppress(Exception):  # a last look; a failed one says nothing
            self._read()
        t, now = self.tracker, time.time()
        self.view.update(now)
        ranks = self.view.ranks()
        if not t.active or not (any(p.alive for p in ranks) or run_holder(self.dir)):
            return
        others = [
            g for g in guards(self.dir, t.run_id) if now - (g.get("looked_at") or 0) < GUARD_STALE_S
        ]
        left = f"{len(others)} other guard(s) still watch it" if others else "no guard watches it"
        said = f"the guard of {self.source} stopped while attempt {t.attempt} goes on: {left}"
        incident = f"{self.host}-{self.pid}"
        self.sink.raise_alert(
            Alert("guard_stopped", said, t.last_step, t.attempt, run_id=t.run_id, incident=incident)
        )

    # -- one look ------------------------------------------------------------------------

    def tick(self, now: float | None = None) -> None:
        """Read what is new, look at the processes, and raise what the rules find."""
        self._read()
        now = time.time() if now is None else now
        self.view.update(now)
        if self.options.hang is not None:
            self._hang(now)
        if self.options.deaths:
            holder = run_holder(self.dir)
            self.launcher_seen = self.launcher_seen or holder is not None
            found = check_died(
                self.tracker, self.view, holder, now, launcher_seen=self.launcher_seen
            )
            if found is not None:  # once: its identity is claimed (the sink drops repeats)
                died = Alert("died", found.message, found.step, found.attempt, run_id=found.run_id)
                self.sink.raise_alert(died)

    def _read(self) -> None:
        if self.reader is None:
            if not self.journal.exists():
                return
            self.reader = store.follow(self.journal, self.start_cursor)
        self.reader.check()
        while True:
            batch = self.reader.read(max_bytes=8 << 20)
            for rec in batch.records:
                self.tracker.observe(rec)
                self.saved = rec["event"] == "save" or (
                    self.saved and rec["event"] != "train_begin"
                )
                if rec["event"] == "train_begin":
                    self.view.set_attempt(self.tracker.begin, dict(self.launcher_pids or {}))
                    if self.launcher_pids is None:
                        self.view.add_launcher(self.dir)
            if not batch.records:
                return

    def _hang(self, now: float) -> None:
        ranks = self.view.ranks()
        if ranks and all(p.local and not p.alive for p in ranks):
            return  # every rank is gone: a death (or an ending on its way), not a hang
        assert self.options.hang is not None
        found = check(self.tracker, read_phase(self.dir), now, self.options.hang)
        self._recovered(found, now)
        if found is None:
            return
        tried = ("abort", found.run_id, found.attempt)  # one abort per attempt, verified or not
        abort = self.options.on_hang == "abort" and tried not in self.raised
        if abort:
            self.raised.add(tried)
        elif self.sink.repeats(_hang(found, "")) or self._paged_lately(found, now):
            return  # the sink would drop it: no evidence for an alert never raised
        self._hang_alert(found, abort)

    def _paged_lately(self, found: HangFinding, now: float) -> bool:
        """A hang of this attempt was raised less than PAGE_EVERY_S ago: a new one waits
        (it is raised once the minute is up, if it lasts)."""
        return any(
            c.get("alert") == "hang"
            and c.get("attempt") == found.attempt
            and now - (c.get("raised_at") or 0.0) < PAGE_EVERY_S
            for c in claims(self.dir, found.run_id)
        )

    def _recovered(self, found: HangFinding | None, now: float) -> None:
        """Each hang of this attempt that steps have ended since (progress after its
        start, and not the hang found now) is told as recovered, once. Looked at when the
        guard sees new progress."""
        t = self.tracker
        if not t.active or t.last_progress_ts == self._progress_seen:
            return
        self._progress_seen = t.last_progress_ts
        now_incident = found is not None and _incident(found)
        for c in claims(self.dir, t.run_id):
            incident = c.get("incident")
            if c.get("alert") != "hang" or c.get("attempt") != t.attempt or not incident:
                continue
            if incident == now_incident or (t.last_progress_ts or 0) <= float(incident):
                continue  # still the hang found now, or no step since it began
            took = f"{now - c.get('raised_at', now):.0f}s after its alert {c.get('id')}"
            said = f"the hang at step {c.get('step')} is over: steps go on (step {t.last_step})"
            ids = {"run_id": t.run_id, "incident": incident, "resolves": c.get("id")}
            self.sink.raise_alert(
                Alert("recovered", f"{said}, {took}", t.last_step, t.attempt, **ids)
            )

    def _hang_alert(self, found: HangFinding, abort: bool) -> None:
        alert_id = new_alert_id()
        where = evidence_dir(self.dir, alert_id)
        begin = self.tracker.begin
        nccl = begin.get("backend") == "nccl" and begin.get("device_type") == "cuda"
        ev = collect(self.dir, where, self.view, summary=found.message, nccl=nccl)
        why_not = self._unverified(found) if abort else None
        ending, relaunch = abort and why_not is None, self.options.relaunch  # what comes next
        follows = relaunch(self.saved) if relaunch else None
        done = "aborting the attempt" if ending else f"not aborted: {why_not}"
        done = done if abort else "left as it is"
        said = stuck(self.view, {} if nccl else ev.stacks)  # NCCL waits in CUDA, not in its calls
        message = f"{found.message}; {said}; {done} (--on-hang {self.options.on_hang})"
        wait = "" if ending else "once its collectives time out (--pg-timeout): "
        message += f"; {wait}{follows}" if follows else ""
        alert = replace(
            _hang(found, message), evidence=tuple(ev.files), missing=tuple(ev.missing), id=alert_id
        )
        self.sink.raise_alert(alert)  # it says it on the console
        if ending:
            self.abort(alert, found)

    def _unverified(self, found: HangFinding) -> str | None:
        """Why the hung attempt's ranks on this host may not be signalled, in one line; None
        when its attempt has not ended and each is verifiably its live rank
        (:meth:`Proc.unverified`)."""
        self._read()
        now = (self.tracker.run_id, self.tracker.attempt)
        if not self.tracker.active or now != (found.run_id, found.attempt):
            return f"attempt {found.attempt} has ended"
        local = [p for p in self.view.ranks() if p.local and p.alive]
        whys = [why for p in local if (why := p.unverified(self.dir))]
        more = f" (and {len(whys) - 1} more)" if len(whys) > 1 else ""
        return whys[0] + more if whys else None

    # -- abort -----------------------------------------------------------------------------

    def abort(self, alert: Alert, found: HangFinding) -> None:
        """End the hung attempt's ranks on this host: SIGTERM, then SIGKILL after
        ``term_grace_s``. The marker ``abort.json`` beside the alert's evidence, written
        first, tells whoever writes the attempt's ``train_end`` that it was a hang."""
        ranks = [p for p in self.view.ranks() if p.local and p.alive]
        marker = {
            "alert_id": alert.id,
            "run_id": found.run_id,
            "attempt": found.attempt,
            "step": found.step,
            "message": found.message,
            "source": self.source,
            "pids": [p.pid for p in ranks],
            "at": time.time(),
        }
        where = evidence_dir(self.dir, alert.id)
        atomic_write(where / ABORT_FILE, orjson.dumps(marker), root=self.dir)
        if remote := [p for p in self.view.ranks() if not p.local]:
            log.warning("--on-hang abort: %d rank(s) on other hosts not ended here", len(remote))
        _signal_all(ranks, signal.SIGTERM)
        if not _gone(ranks, self.options.term_grace_s):
            _signal_all(ranks, signal.SIGKILL)
            if not _gone(ranks, KILL_WAIT_S):
                log.error("--on-hang abort: some ranks outlived SIGKILL")
        marker["ended_at"] = time.time()  # evidence too: how long the ending took
        atomic_write(where / ABORT_FILE, orjson.dumps(marker), root=self.dir)
        if run_holder(self.dir) is None:  # no launcher to write the ending: we do
            self._write_end(marker)

    def _write_end(self, marker: dict[str, Any]) -> None:
        if store.tail(self.journal).ended:
            return  # the attempt wrote its own ending after all
        try:
            with store.guest(self.dir, role="watcher", timeout=10) as w:
                w.append("train_end", hang_end_payload(marker, written_by="watcher"))
        except JournalLocked as exc:
            log.error("cannot journal the aborted attempt's end: %s", exc)


def _incident(found: HangFinding) -> str:
    """A hang's incident: when its quiet (or its phase) began, as every guard reads it."""
    return f"{found.since:.3f}"


def _hang(found: HangFinding, message: str) -> Alert:
    return Alert(
        "hang", message, found.step, found.attempt, run_id=found.run_id, incident=_incident(found)
    )


def _signal_all(procs: list[Proc], sig: int) -> None:
    for p in procs:
        if start_time(p.pid) == p.start:  # still the process verified, not a reused pid
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p.pid, sig)


def _gone(procs: list[Proc], timeout: float) -> bool:
    """Whether every process ended within ``timeout`` (a zombie has ended)."""
    deadline = time.monotonic() + timeout
    while True:
        if all((f := stat_fields(p.pid)) is None or f[0] in ("Z", "X") for p in procs):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def hang_end_payload(
    marker: dict[str, Any], *, written_by: str, rc: int | None = None
) -> dict[str, Any]:
    """The ``train_end`` of an attempt the guard aborted as hung: ``failed``, with
    ``aborted_for: "hang"`` (``status`` and ``check`` say ``stop_source == "hang"``,
    journal/views/stops.py) and the alert that holds the evidence."""
    exit_code = f" (workers exited with code {rc})" if rc is not None else ""
    reason = (
        f"hang: {marker.get('message')}; aborted by the hang guard{exit_code}: evidence in "
        f"alerts/{marker.get('alert_id')}"
    )
    return {
        "status": "failed",
        "reason": reason,
        "final_checkpoint": None,
        "error_type": "Hang",
        "error_message": reason,
        "traceback": None,
        "written_by": written_by,
        "aborted_for": "hang",
        "aborted_by": marker.get("source"),
        "alert_id": marker.get("alert_id"),
    }


def find_abort(run_dir: Path, run_id: str | None, attempt: int | None) -> dict[str, Any] | None:
    """The abort marker of that attempt (the guard of ``ilab-watch`` or of this launcher
    aborted it), or None."""
    root = run_dir / "alerts"
    try:
        names = sorted(os.listdir(root), reverse=True)  # alert ids are time-ordered
    except OSError:
        return None
    for name in names:
        try:
            marker = orjson.loads((root / name / ABORT_FILE).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            continue
        ours = isinstance(marker, dict) and marker.get("run_id") == run_id
        if ours and marker.get("attempt") == attempt:
            return marker
    return None
