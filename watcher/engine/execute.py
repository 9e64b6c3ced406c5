"""Running one delivery: an external command in its own process group, or a Python callable.

Both get the same retry loop (doubling backoff, capped at 60 s) and report into one
:class:`DeliveryResult`. Commands see the record as JSON in the file ``$ILAB_EVENT_FILE``
(also their stdin, and ``$ILAB_EVENT_JSON`` when small) and as ``ILAB_*`` environment
variables, and may write results as a JSON object to ``$ILAB_REPORT`` (see
:mod:`watcher.hooks.command`); callables get ``(event, **payload)`` and may return ``Control``s
and ``Report``s.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from journal.channels.reports import InvalidReport, Report
from journal.rundir.files import atomic_write
from journal.rundir.inbox import RejectedFile, read_file
from journal.rundir.procs import start_time
from watcher.engine.handback import HandBack
from watcher.engine.jobs import JobRun, JobRunners, JobSite
from watcher.engine.leasing import CheckpointGuard
from watcher.engine.statedir import StateFiles, delivery_log_name
from watcher.hooks.callbacks import CommandTarget, Event
from watcher.hooks.command import command_env, log_text, run_command
from watcher.hooks.delivery import (
    Delivery,
    DeliveryResult,
    TrackerUnavailable,
    state_write_failed,
)

log = logging.getLogger("watcher")

#: Output kept in the results file per stream (the delivery log keeps 64 KiB).
TAIL_BYTES = 2000
DEFAULT_COMMAND_TIMEOUT_S = 3600.0
#: The most a command may write to ``$ILAB_REPORT``.
REPORT_FILE_MAX_BYTES = 64 * 1024
#: Full tracebacks a hook's failures print (the first ones); later failures are counted
#: (watcher.engine.completion keeps every failure's one-line error in the results file).
TRACEBACKS_SAID = 3


@dataclass(frozen=True, slots=True)
class Attempt:
    """A callable's first attempt, made by :meth:`Executor.deliver` before any result."""

    returned: Any
    error: BaseException | None
    t0: float  # its perf_counter start


class Executor:
    """Runs deliveries for one watcher. ``files``: its state files (logs, running markers,
    scratch; None: none written); ``stop`` ends retries and backoff waits early;
    ``checkpoints`` says whether a save delivery's checkpoint is already gone (skipped);
    ``notice`` says (once) that the state dir cannot be written; ``jobs`` makes the runner
    of the command hooks with ``via`` (:mod:`watcher.engine.jobs`)."""

    def __init__(
        self,
        journal: Path,
        *,
        files: StateFiles | None,
        control_source: str,
        stop: threading.Event,
        checkpoints: CheckpointGuard,
        notice: Callable[[str], None] = log.warning,
        jobs: JobRunners | None = None,
    ) -> None:
        self.journal = journal
        self.ckpt_dir = str(journal.parent)
        self.files = files
        self.control_source = control_source
        self.stop = stop
        self.checkpoints = checkpoints
        self.notice = notice
        self._scratch: Path | None = None  # files.scratch once made: event and report files
        self._tmp_scratch: Path | None = None  # the same in the system's temp dir (fallback)
        self._running_ready = False
        self._jobs = jobs
        self._job_run: JobRun | None = None  # made at the first job (--via)
        self._jobs_lock = threading.Lock()
        self.handback = HandBack(self.ckpt_dir, control_source, notice)
        self._tracebacks: dict[str, int] = {}  # hook id -> full tracebacks printed
        self._tracebacks_lock = threading.Lock()

    def job_run(self) -> JobRun:
        """The runner of this executor's scheduler jobs (made at the first one)."""
        with self._jobs_lock:
            if self._job_run is None:
                if self._jobs is None:  # the Watcher refuses such hooks at its start
                    raise RuntimeError("a hook runs via a scheduler, and no jobs= was given")
                site = JobSite(
                    self.files,
                    self.ckpt_dir,
                    self.journal,
                    self.control_source,
                    self.stop,
                    self.notice,
                    values=self._values,
                    read_report=self._report_from_file,
                )
                self._job_run = self._jobs(site)
            return self._job_run

    def deliver(self, d: Delivery) -> DeliveryResult | None:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops.

        None: a callable that returned nothing at its first attempt, the common case of a
        replay (it is counted, and written in its batch's results line, without a result
        object of its own)."""
        hook = d.hook
        if not hook.inline:
            return self._deliver(d)
        t0 = time.perf_counter()
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        try:
            returned = hook.target(event, **_keywords(event.data))  # type: ignore[operator]
        except BaseException as exc:  # a callback's SystemExit too: the hook fails, not us
            return self._deliver(d, first=Attempt(None, exc, t0))
        if returned is None:
            return None
        return self._deliver(d, first=Attempt(returned, None, t0))

    def _deliver(self, d: Delivery, first: Attempt | None = None) -> DeliveryResult:
        opts = d.hook.options
        if self.checkpoints.removed(d):
            path = (d.record.get("data") or {}).get("checkpoint_path")
            return DeliveryResult.of(d, "skipped", error=f"checkpoint {path} was removed")
        started = time.time()
        out = DeliveryResult.of(d, "failed", start_ts=started)
        for attempt in range(1, opts.retries + 2):
            out.attempts = attempt
            t0 = time.perf_counter()
            try:
                if isinstance(d.hook.target, CommandTarget):
                    self._run_command(d.hook.target, d, out, attempt)
                elif first is not None and attempt == 1:  # it ran already (deliver)
                    out.start_ts = started - (t0 - first.t0)
                    t0 = first.t0
                    self._judge_callable(first.returned, first.error, d, out)
                else:
                    self._run_callable(d.hook.target, d, out)
            except Exception as exc:  # ours, not the hook's: the attempt and its log still count
                log.exception("delivery %s, attempt %d", d.delivery_id, attempt)
                out.status, out.error = "failed", f"internal error: {type(exc).__name__}: {exc}"
            out.duration = time.perf_counter() - t0
            if out.status in ("ok", "skipped") or self.stop.is_set():
                break
            if attempt <= opts.retries:
                delay = min(60.0, opts.backoff * 2 ** (attempt - 1))
                if self.stop.wait(delay):
                    break
        out.end_ts = time.time()
        return out

    def close(self) -> None:
        """Remove the scratch dir made in the system's temp dir, if one was needed (and
        journal the job states still pending, with --via)."""
        if self._job_run is not None:
            self._job_run.close()
        if self._tmp_scratch is not None:
            shutil.rmtree(self._tmp_scratch, ignore_errors=True)
            self._tmp_scratch = None

    # -- commands ------------------------------------------------------------------------

    def _values(self, d: Delivery) -> dict[str, Any]:
        """What ``{name}`` placeholders can name: payload, envelope and a few extras."""
        rec = d.record
        values: dict[str, Any] = dict(rec.get("data") or {})
        values.update({k: v for k, v in rec.items() if k != "data"})
        values.update(ckpt_dir=self.ckpt_dir, delivery_id=d.delivery_id, journal=str(self.journal))
        return values

    def _run_command(
        self, target: CommandTarget, d: Delivery, out: DeliveryResult, attempt: int
    ) -> None:
        if d.hook.options.via is not None:  # a scheduler job (--via): watcher.engine.jobs
            self.job_run().run(target, d, out, attempt)
            return
        payload = orjson.dumps(d.record)
        argv = target.render(self._values(d))
        timeout = d.hook.options.timeout
        timeout = DEFAULT_COMMAND_TIMEOUT_S if timeout is None else timeout
        stem = f"{d.file_stem}-a{attempt}"
        try:
            event_file = self._scratch_file(f"{stem}.event.json", payload)
        except OSError as exc:
            out.status, out.exit_code = "failed", None
            out.error = f"cannot write the record for the command: {exc.strerror or exc}"
            return
        report_file = event_file.with_name(f"{stem}.json")
        _discard(report_file)  # a killed predecessor's attempt must not count
        env = command_env(
            d.record,
            payload,
            event_file,
            ckpt_dir=self.ckpt_dir,
            journal=str(self.journal),
            delivery_id=d.delivery_id,
        )
        env["ILAB_REPORT"] = str(report_file)
        try:
            ran = run_command(
                argv, env, event_file, timeout, lambda pid: self._mark_running(pid, d)
            )
            out.status, out.exit_code, out.error = ran.status, ran.exit_code, ran.error
            out.stdout_tail = ran.stdout.data[-TAIL_BYTES:].decode("utf-8", "replace")
            out.stderr_tail = ran.stderr.data[-TAIL_BYTES:].decode("utf-8", "replace")
            if ran.exit_code is not None and self.files is not None:
                out.log_path = self._write_state(
                    self.files.logs / delivery_log_name(d, attempt),
                    log_text(argv, ran.stdout, ran.stderr),
                )
            if out.status == "ok" and report_file.exists():
                self._report_from_file(report_file, d, out)
        finally:
            event_file.unlink(missing_ok=True)
            _discard(report_file)  # even if the command made it a directory

    def _scratch_file(self, name: str, data: bytes) -> Path:
        """Write a file a command reads (its record) in the state dir, or in the system's
        temp dir when the state dir cannot be written (a full or read-only disk)."""
        if self.files is not None:
            try:
                if self._scratch is None:
                    base = self.files.scratch
                    base.mkdir(parents=True, exist_ok=True)  # once: a delivery pays no mkdir
                    self._scratch = base
                path = self._scratch / name
                atomic_write(path, data, durable=False)  # read once, by a live command
                return path
            except OSError as exc:
                self.notice(state_write_failed(self.files.dir, exc))
        if self._tmp_scratch is None:
            self._tmp_scratch = Path(tempfile.mkdtemp(prefix="ilab-watch-"))
        path = self._tmp_scratch / name
        atomic_write(path, data, durable=False)
        return path

    def _write_state(self, path: Path, data: bytes) -> str | None:
        """Write a file of the watcher's state; None (said once) when it cannot be."""
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)  # a part of it, on a full disk
            self.notice(state_write_failed(path.parent.parent, exc))
            return None
        return str(path)

    def _mark_running(self, pid: int, d: Delivery) -> Path | None:
        """Note a running command's process group, so that a watcher restarted after a
        ``kill -9`` ends it before running the delivery again (never two at once)."""
        if self.files is None:
            return None
        running = self.files.running
        marker = running / f"{d.file_stem}.json"
        try:
            if not self._running_ready:
                running.mkdir(parents=True, exist_ok=True)
                self._running_ready = True
            # not fsynced: no process outlives a reboot, so neither need this
            data = orjson.dumps({"pgid": pid, "start": start_time(pid)})
            atomic_write(marker, data, durable=False)
        except OSError as exc:
            self.notice(state_write_failed(self.files.dir, exc))
            return None
        return marker

    # -- callables -----------------------------------------------------------------------

    def _run_callable(self, fn: Callable[..., Any], d: Delivery, out: DeliveryResult) -> None:
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        kwargs = _keywords(event.data)
        result: list[Any] = []
        error: list[BaseException] = []

        def call() -> None:
            try:
                result.append(fn(event, **kwargs))
            except BaseException as exc:
                error.append(exc)

        timeout = d.hook.options.timeout
        if timeout is None:
            call()
        else:  # a thread we can stop waiting for (Python cannot kill it: it runs on, detached)
            t = threading.Thread(target=call, daemon=True, name=f"callback-{d.hook.short_id}")
            t.start()
            t.join(timeout)
            if t.is_alive():
                out.status, out.error = "timeout", f"timed out after {timeout:g}s (left running)"
                return
        self._judge_callable(result[0] if result else None, error[0] if error else None, d, out)

    def _judge_callable(
        self, returned: Any, exc: BaseException | None, d: Delivery, out: DeliveryResult
    ) -> None:
        """Record what a callable's attempt gave: its exception, or what it returned."""
        if exc is not None:
            if isinstance(exc, TrackerUnavailable):  # its exporter's one line, said once
                self.notice(str(exc))
                out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
                return
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            if self._say_traceback(d):  # the first ones: a callback failing on every record
                log.error(  # must not flood the console (the later ones are counted)
                    "callback %s failed on %s seq %s:\n%s",
                    d.hook.label,
                    d.hook.event,
                    d.record["seq"],
                    tb,
                )
            out.status, out.error = "failed", f"{type(exc).__name__}: {exc}"
            out.stderr_tail = tb[-TAIL_BYTES:]
            return
        out.status, out.error = "ok", None
        if returned is not None:
            self._act_on(returned, d, out)

    def _say_traceback(self, d: Delivery) -> bool:
        """Whether this failure of ``d``'s hook prints its traceback: the first
        :data:`TRACEBACKS_SAID` do (a hook's deliveries run on one thread at a time, but
        hooks share this executor: the count is per hook)."""
        with self._tracebacks_lock:
            said = self._tracebacks.get(d.hook.id, 0)
            self._tracebacks[d.hook.id] = said + 1
        return said < TRACEBACKS_SAID

    # -- what a callback hands back (watcher.engine.handback) -----------------------------------

    def _act_on(self, returned: Any, d: Delivery, out: DeliveryResult) -> None:
        self.handback.act_on(returned, d, out)

    def note_records(self, records: list[dict[str, Any]]) -> None:
        """Records just read: see :meth:`HandBack.note_records`."""
        self.handback.note_records(records)

    def _report_from_file(self, path: Path, d: Delivery, out: DeliveryResult) -> None:
        """A command wrote a JSON object of metrics to ``$ILAB_REPORT`` (a regular file of
        at most 64 KiB: not a FIFO, a symlink or a flood)."""
        try:
            metrics = orjson.loads(read_file(path, REPORT_FILE_MAX_BYTES))
            if not isinstance(metrics, dict):
                raise InvalidReport("expected a JSON object of name: value")
            self.handback.submit(Report(metrics), d, out)
        except (OSError, orjson.JSONDecodeError, InvalidReport, RejectedFile) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            out.status, out.error = "failed", f"$ILAB_REPORT: {why}"


#: Payload key sets seen, and whether all of them are identifiers (a few per journal).
_IDENTIFIER_KEYS: dict[tuple[str, ...], bool] = {}


def _keywords(data: dict[str, Any]) -> dict[str, Any]:
    """The payload fields that can be keyword arguments (a bridge may log ``train/loss``)."""
    keys = tuple(data)
    plain = _IDENTIFIER_KEYS.get(keys)
    if plain is None:
        plain = _IDENTIFIER_KEYS[keys] = all(k.isidentifier() for k in keys)
        if len(_IDENTIFIER_KEYS) > 1024:  # a journal whose every record has its own keys
            _IDENTIFIER_KEYS.clear()
    return data if plain else {k: v for k, v in data.items() if k.isidentifier()}


def _discard(path: Path) -> None:
    """Remove a command's scratch file, also when the command replaced it by a directory."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        if not (path.is_dir() and not path.is_symlink()):
            raise
        shutil.rmtree(path, ignore_errors=True)
