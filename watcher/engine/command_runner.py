"""Running a command hook's deliveries as processes of the watcher.

Each attempt is an external command in its own process group (watcher.hooks.command). It
sees the record as JSON in the file ``$ILAB_EVENT_FILE`` (also its stdin, and
``$ILAB_EVENT_JSON`` when small) and as ``ILAB_*`` environment variables, and may write
results as a JSON object to ``$ILAB_REPORT``, submitted as the delivery's report. A running
command is marked in the state dir, so that a watcher restarted after a ``kill -9`` ends it
before running the delivery again.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from journal.channels.reports import InvalidReport, Report
from journal.rundir.files import atomic_write
from journal.rundir.inbox import RejectedFile, read_file
from journal.rundir.procs import start_time
from watcher.engine.attempts import TAIL_BYTES, Retries
from watcher.engine.handback import HandBack
from watcher.engine.statedir import StateFiles, delivery_log_name
from watcher.hooks.callbacks import CommandTarget
from watcher.hooks.command import command_env, log_text, run_command
from watcher.hooks.delivery import Delivery, DeliveryResult, state_write_failed

DEFAULT_COMMAND_TIMEOUT_S = 3600.0
#: The most a command may write to ``$ILAB_REPORT``.
REPORT_FILE_MAX_BYTES = 64 * 1024


@dataclass(eq=False)
class CommandRunner:
    """Runs the deliveries of command hooks in the watcher's processes. ``files``: the
    watcher's state files (logs, running markers, scratch; None: none written, scratch in
    the system's temp dir); ``notice`` says (once) that the state dir cannot be written."""

    journal: Path
    _: KW_ONLY
    files: StateFiles | None
    retries: Retries
    handback: HandBack
    notice: Callable[[str], None]
    #: the scratch dir in the system's temp dir (the fallback)
    _tmp_scratch: Path | None = field(default=None, init=False)

    @property
    def ckpt_dir(self) -> str:
        return str(self.journal.parent)

    def deliver(self, d: Delivery) -> DeliveryResult:
        """Run ``d`` until it succeeds, its retries are spent, or the watcher stops."""
        return self.retries.run(d, self._attempt)

    def close(self) -> None:
        """Remove the scratch dir made in the system's temp dir, if one was needed."""
        if self._tmp_scratch is not None:
            shutil.rmtree(self._tmp_scratch, ignore_errors=True)
            self._tmp_scratch = None

    def values(self, d: Delivery) -> dict[str, Any]:
        """What ``{name}`` placeholders can name: payload, envelope and a few extras."""
        rec = d.record
        values: dict[str, Any] = dict(rec["data"])
        values.update({k: v for k, v in rec.items() if k != "data"})
        values.update(ckpt_dir=self.ckpt_dir, delivery_id=d.delivery_id, journal=str(self.journal))
        return values

    def report_from_file(self, path: Path, d: Delivery, out: DeliveryResult) -> None:
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

    def _attempt(self, d: Delivery, out: DeliveryResult, attempt: int) -> None:
        target: CommandTarget = d.hook.target  # type: ignore[assignment]
        payload = orjson.dumps(d.record)
        argv = target.render(self.values(d))
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
        env = command_env(d, payload, event_file, report_file, self.journal)
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
                self.report_from_file(report_file, d, out)
        finally:
            event_file.unlink(missing_ok=True)
            _discard(report_file)  # even if the command made it a directory

    def _scratch_file(self, name: str, data: bytes) -> Path:
        """Write a file a command reads (its record) in the state dir, or in the system's
        temp dir when the state dir cannot be written (a full or read-only disk)."""
        if self.files is not None:
            try:
                path = self.files.scratch / name
                atomic_write(path, data, root=self.files.root, durable=False)  # read once
                return path
            except OSError as exc:
                self.notice(state_write_failed(self.files.dir, exc))
        if self._tmp_scratch is None:
            self._tmp_scratch = Path(tempfile.mkdtemp(prefix="ilab-watch-"))
        path = self._tmp_scratch / name
        atomic_write(path, data, root=self._tmp_scratch, durable=False)
        return path

    def _write_state(self, path: Path, data: bytes) -> str | None:
        """Write a file of the watcher's state; None (said once) when it cannot be."""
        assert self.files is not None
        try:
            atomic_write(path, data, root=self.files.root, durable=False)
        except OSError as exc:  # never a part of it: atomic
            self.notice(state_write_failed(path.parent.parent, exc))
            return None
        return str(path)

    def _mark_running(self, pid: int, d: Delivery) -> Path | None:
        """Note a running command's process group, so that a watcher restarted after a
        ``kill -9`` ends it before running the delivery again (never two at once)."""
        if self.files is None:
            return None
        marker = self.files.running / f"{d.file_stem}.json"
        try:
            # not fsynced: no process outlives a reboot, so neither need this
            data = orjson.dumps({"pgid": pid, "start": start_time(pid)})
            atomic_write(marker, data, root=self.files.root, durable=False)
        except OSError as exc:
            self.notice(state_write_failed(self.files.dir, exc))
            return None
        return marker


def _discard(path: Path) -> None:
    """Remove a command's scratch file, also when the command replaced it by a directory."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        if not (path.is_dir() and not path.is_symlink()):
            raise
        shutil.rmtree(path, ignore_errors=True)
