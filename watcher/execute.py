"""Running one delivery: an external command in its own process group, or a Python callable.

Both get the same retry loop (doubling backoff, capped at 60 s) and report into one
:class:`DeliveryResult`. Commands see the record as JSON on stdin and as ``ILAB_*``
environment variables, and may write results as a JSON object to ``$ILAB_REPORT``;
callables get ``(event, **payload)`` and may return ``Control``s and ``Report``s.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from journal.control import Control, send_command
from journal.files import atomic_write, json_files
from journal.procs import spawn_dying_with_us, start_time
from journal.reports import InvalidReport, Report, submit_report
from watcher.callbacks import CommandTarget, Event
from watcher.delivery import Delivery, DeliveryResult

log = logging.getLogger("watcher")

TAIL_BYTES = 2000
DEFAULT_COMMAND_TIMEOUT_S = 3600.0


class Executor:
    """Runs deliveries for one watcher. ``stop`` ends retries and backoff waits early;
    ``removed(d)`` says whether a save delivery's checkpoint is already gone (skipped)."""

    def __init__(
        self,
        journal: Path,
        *,
        logs_dir: Path | None,
        control_source: str,
        stop: threading.Event,
        removed: Callable[[Delivery], bool] = lambda d: False,
        running_dir: Path | None = None,
    ) -> None:
        self.journal = journal
        self.ckpt_dir = str(journal.parent)
        self.logs_dir = logs_dir
        self.control_source = control_source
        self.stop = stop
        self.removed = removed
        self.running_dir = running_dir
        self._reports: Path | None = None
        self._running_ready = False

    def deliver(self, d: Delivery) -> DeliveryResult:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops."""
        opts = d.hook.options
        if self.removed(d):
            path = (d.record.get("data") or {}).get("checkpoint_path")
            return DeliveryResult.of(d, "skipped", error=f"checkpoint {path} was removed")
        out = DeliveryResult.of(d, "failed", start_ts=time.time())
        for attempt in range(1, opts.retries + 2):
            out.attempts = attempt
            t0 = time.perf_counter()
            if isinstance(d.hook.target, CommandTarget):
                self._run_command(d.hook.target, d, out, attempt)
            else:
                self._run_callable(d.hook.target, d, out)
            out.duration = time.perf_counter() - t0
            if out.status == "ok" or self.stop.is_set():
                break
            if attempt <= opts.retries:
                delay = min(60.0, opts.backoff * 2 ** (attempt - 1))
                if self.stop.wait(delay):
                    break
        out.end_ts = time.time()
        return out

    # -- commands ------------------------------------------------------------------------

    def _values(self, d: Delivery) -> dict[str, Any]:
        """What ``{name}`` placeholders can name: payload, envelope and a few extras."""
        rec = d.record
        values: dict[str, Any] = dict(rec.get("data") or {})
        values.update({k: v for k, v in rec.items() if k != "data"})
        values.update(ckpt_dir=self.ckpt_dir, delivery_id=d.delivery_id, journal=str(self.journal))
        return values

    def _env(self, d: Delivery, payload: bytes) -> dict[str, str]:
        rec = d.record
        env = dict(os.environ)
        for k, v in (rec.get("data") or {}).items():
            if isinstance(v, (str, int, float, bool)) or v is None:
                env[f"ILAB_{k.upper()}"] = "" if v is None else str(v)
        env.update(
            ILAB_EVENT=str(rec.get("event")),
            ILAB_STEP=str(rec.get("step", 0)),
            ILAB_EPOCH=str(rec.get("epoch", 0)),
            ILAB_RUN_ID=str(rec.get("run_id", "")),
            ILAB_SEQ=str(rec["seq"]),
            ILAB_ATTEMPT=str(rec.get("attempt", 1)),
            ILAB_CKPT_DIR=self.ckpt_dir,
            ILAB_JOURNAL=str(self.journal),
            ILAB_DELIVERY_ID=d.delivery_id,
            ILAB_EVENT_JSON=payload.decode(),
        )
        return env

    def _run_command(
        self, target: CommandTarget, d: Delivery, out: DeliveryResult, attempt: int
    ) -> None:
        payload = orjson.dumps(d.record)
        argv = target.render(self._values(d))
        timeout = d.hook.options.timeout
        timeout = DEFAULT_COMMAND_TIMEOUT_S if timeout is None else timeout
        report_file = self._report_dir() / f"{d.delivery_id}-a{attempt}.json"
        report_file.unlink(missing_ok=True)  # a killed predecessor's attempt must not count
        env = self._env(d, payload)
        env["ILAB_REPORT"] = str(report_file)
        try:
            self._spawn_and_wait(argv, env, payload, timeout, d, out, attempt)
            if out.status == "ok" and report_file.exists():
                self._report_from_file(report_file, d, out)
        finally:
            report_file.unlink(missing_ok=True)

    def _report_dir(self) -> Path:
        """Where commands write ``$ILAB_REPORT`` (made once: a delivery pays no mkdir)."""
        if self._reports is None:
            base = self.running_dir.with_suffix(".reports") if self.running_dir else None
            if base is None:
                self._reports = Path(tempfile.mkdtemp(prefix="ilab-reports-"))
            else:
                base.mkdir(parents=True, exist_ok=True)
                self._reports = base
        return self._reports

    def _spawn_and_wait(
        self,
        argv: list[str],
        env: dict[str, str],
        payload: bytes,
        timeout: float,
        d: Delivery,
        out: DeliveryResult,
        attempt: int,
    ) -> None:
        run_argv, preexec = spawn_dying_with_us(argv)  # it ends with the watcher, kill -9 too
        try:
            proc = subprocess.Popen(
                run_argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                start_new_session=True,  # its own process group: a timeout kills it whole
                preexec_fn=preexec,
            )
        except OSError as exc:
            out.status, out.exit_code = "failed", None
            out.error = f"cannot start {argv[0]}: {exc.strerror}"
            return
        marker = self._mark_running(proc.pid, d)
        try:
            stdout, stderr = proc.communicate(payload, timeout=timeout)
            out.status = "ok" if proc.returncode == 0 else "failed"
            out.error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            kill_group(proc)
            stdout, stderr = proc.communicate()
            out.status = "timeout"
            out.error = f"timed out after {timeout:g}s (process group killed)"
        if marker is not None:
            marker.unlink(missing_ok=True)
        out.exit_code = proc.returncode
        out.stdout_tail = stdout[-TAIL_BYTES:].decode("utf-8", "replace")
        out.stderr_tail = stderr[-TAIL_BYTES:].decode("utf-8", "replace")
        if self.logs_dir is not None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            name = f"{d.record['seq']:08d}-{d.hook.event}-{d.hook.short_id}-a{attempt}.log"
            lp = self.logs_dir / name
            head = b"$ " + " ".join(argv).encode()
            lp.write_bytes(head + b"\n--- stdout\n" + stdout + b"\n--- stderr\n" + stderr)
            out.log_path = str(lp)

    def _mark_running(self, pid: int, d: Delivery) -> Path | None:
        """Note a running command's process group, so that a watcher restarted after a
        ``kill -9`` ends it before running the delivery again (never two at once)."""
        if self.running_dir is None:
            return None
        if not self._running_ready:
            self.running_dir.mkdir(parents=True, exist_ok=True)
            self._running_ready = True
        marker = self.running_dir / f"{d.delivery_id}.json"
        # not fsynced: no process outlives a reboot, so neither need this
        atomic_write(marker, orjson.dumps({"pgid": pid, "start": start_time(pid)}), durable=False)
        return marker

    # -- callables -----------------------------------------------------------------------

    def _run_callable(self, fn: Callable[..., Any], d: Delivery, out: DeliveryResult) -> None:
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        kwargs = {k: v for k, v in event.data.items() if k.isidentifier()}
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
        if error:
            exc = error[0]
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log.error(
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
        self._act_on(result[0], d, out)

    # -- what a callback hands back ------------------------------------------------------

    def _act_on(self, returned: Any, d: Delivery, out: DeliveryResult) -> None:
        """Send the ``Control``s and ``Report``s a callable returned (alone or in a list)."""
        items = returned if isinstance(returned, (list, tuple)) else [returned]
        source = f"{self.control_source}:{d.hook.label}"
        for item in items:
            if isinstance(item, Control):
                cid = send_command(self.ckpt_dir, item, source=source)
                out.control = [*(out.control or []), f"{item.command}:{cid}"]
            elif isinstance(item, Report):
                self._submit(item, d, out)

    def _submit(self, report: Report, d: Delivery, out: DeliveryResult) -> None:
        """A report for the delivered event's checkpoint unless it names another one."""
        data = d.record.get("data") or {}
        if report.checkpoint_path is None and isinstance(data.get("checkpoint_path"), str):
            report.checkpoint_path = data["checkpoint_path"]
        if report.step is None:
            report.step = d.record.get("step", 0)
        source = f"{self.control_source}:{d.hook.label}"
        rid = submit_report(self.ckpt_dir, report, source=source, delivery_id=d.delivery_id)
        out.reports = [*(out.reports or []), rid]

    def _report_from_file(self, path: Path, d: Delivery, out: DeliveryResult) -> None:
        """A command wrote a JSON object of metrics to ``$ILAB_REPORT``."""
        try:
            metrics = orjson.loads(path.read_bytes())
            if not isinstance(metrics, dict):
                raise InvalidReport("expected a JSON object of name: value")
            report = Report(metrics)
        except (OSError, orjson.JSONDecodeError, InvalidReport) as exc:
            out.status, out.error = "failed", f"$ILAB_REPORT: {exc}"
            return
        self._submit(report, d, out)


def end_leftovers(running_dir: Path) -> int:
    """Kill the process groups of commands a previous watcher left running (it died
    mid-delivery); returns how many. A pid since reused by another process is left alone."""
    ended = 0
    for marker in json_files(running_dir):
        try:
            info = orjson.loads(marker.read_bytes())
            pgid, started = int(info["pgid"]), info.get("start")
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            marker.unlink(missing_ok=True)
            continue
        if (started is not None and start_time(pgid) == started) or start_time(pgid) is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                ended += 1
        marker.unlink(missing_ok=True)
    return ended


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group, then SIGKILL it if it has not exited within 3 s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue
