"""A command delivery run as a scheduler job (``ilab-watch --via slurm|local``).

One attempt: write the record and a job script on the shared filesystem, submit it, and
wait (the delivery stays running, so its checkpoint lease is renewed) until the job ends;
the job's exit code, state changes, node and log make the result. The script runs the
command with the record on stdin, then writes its exit code beside it. That exit file is
asked first, the scheduler second: a job whose exit file exists has ended, whatever the
scheduler says (it may have forgotten the job, or requeued it after a controller restart:
such a queued copy is cancelled, and the script will not run the command a second time);
a job the scheduler does not know and that left no exit file is ``LOST`` after
:data:`LOST_AFTER_POLLS` polls.

Durable state, for a watcher killed with ``kill -9``: a marker per delivery in
``<state>/<name>.jobs/<delivery>.json``, written before the job is submitted (its unique
job name) and after (its id), and again when the job ended. A restarted watcher that
delivers the record again re-attaches to that job (or takes its recorded end) instead of
submitting a second one; killed between submitting and noting the id, it finds the job by
its name (Slurm, Ray) or by the record a local job cannot run without (``<prefix>.job``,
watcher/scheduler/local.py). Markers of deliveries whose results were recorded are removed
when the watcher ends normally (:meth:`~watcher.scheduler.board.JobBoard.finish`); the
markers, exit files and local jobs' records are watcher/scheduler/markers.py's.

Each state change is also journaled as a ``job`` record (watcher/scheduler/records.py) and
listed in the result's ``jobs``.

The engine runs it as its :class:`~watcher.engine.jobs.JobRun`, made with the
:class:`~watcher.engine.jobs.JobSite` of the executor whose deliveries these are.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.files import atomic_write
from journal.rundir.procs import start_time
from journal.rundir.safety import safe_dir
from watcher.engine.jobs import JobSite
from watcher.engine.statedir import delivery_log_name
from watcher.hooks.callbacks import CommandTarget
from watcher.hooks.command import OUTPUT_KEEP_BYTES, command_env, read_tail
from watcher.hooks.delivery import Delivery, DeliveryResult
from watcher.scheduler import QUEUED_STATES, JobSpec, JobState, SchedulerError
from watcher.scheduler.board import JobBoard, attempt_of
from watcher.scheduler.markers import JOB_RECORD, exit_code, load, recorded_job, save
from watcher.scheduler.records import JobRecords

log = logging.getLogger("watcher")

DEFAULT_JOB_TIMEOUT_S = 3600.0
#: Polls in a row that may not know a job that left no exit code before it counts as lost.
LOST_AFTER_POLLS = 3
_TAIL = 2000

_SCRIPT = """#!/bin/sh
# ilab-watch delivery {did} (attempt {attempt}): the command, then its exit code
# A copy the scheduler runs again (a requeue) after the first ended must not run it twice.
if [ -e {exit} ] || [ ! -e {event} ]; then exit 0; fi
{command} < {event}
code=$?
printf '%s\\n' "$code" > {exit}.tmp && mv -f {exit}.tmp {exit}
exit "$code"
"""


class JobRunner:
    """Runs the command deliveries of one executor (``site``: its state files, stop event,
    notices, placeholder values and $ILAB_REPORT reading) as jobs of ``board``'s
    scheduler: a :class:`watcher.engine.jobs.JobRun`."""

    def __init__(self, board: JobBoard, site: JobSite) -> None:
        self.site = site
        self.board = board
        files = site.files
        self.dir = (
            files.jobs.absolute()
            if files is not None
            else Path(tempfile.mkdtemp(prefix="ilab-jobs-"))
        )
        # no symlink followed below root: the run dir, or the state dir given
        self.logs, self.root = (files.logs, files.root) if files is not None else (self.dir,) * 2
        self.token = f"{os.getpid()}-{start_time(os.getpid())}"  # this watcher process
        self.records = JobRecords(site.ckpt_dir, site.control_source, site.notice)
        board.job_dirs.append(self.dir)  # its ended jobs' markers go at the watcher's end

    # -- one attempt -----------------------------------------------------------------------

    def run(self, target: CommandTarget, d: Delivery, out: DeliveryResult, attempt: int) -> None:
        marker_path = self.dir / f"{d.file_stem}.json"
        marker = load(marker_path)
        if marker is not None and marker.get("owner") != self.token:
            marker["owner"] = self.token  # a previous watcher's job: re-attach, never resubmit
            save(marker_path, marker, root=self.root)
            if marker.get("job_id") is None:  # killed between submitting and noting the id
                # a local job is known to its record only (the scheduler's find knows the
                # jobs of this watcher process); a cluster's, to the scheduler by its name
                found = recorded_job(Path(marker["prefix"])) or self._find(str(marker["job_name"]))
                if found is not None:
                    marker["job_id"] = found
                    save(marker_path, marker, root=self.root)
            if marker.get("job_id") is not None:
                self._follow(marker_path, marker, d, out, adopted=True)
                return
        if self.board.skips(d.record):
            out.status, out.error = "skipped", "not submitted: the run was aborted"
            return
        k = int(marker["attempt"]) + 1 if marker else 1
        marker = self._submit(target, d, out, marker_path, k)
        if marker is not None:
            self._follow(marker_path, marker, d, out, adopted=False)

    def _submit(
        self, target: CommandTarget, d: Delivery, out: DeliveryResult, marker_path: Path, k: int
    ) -> dict[str, Any] | None:
        prefix = self.dir / f"{d.file_stem}-a{k}"
        payload = orjson.dumps(d.record)
        logs = self.logs
        log_path = logs / delivery_log_name(d, k)
        try:
            safe_dir(self.root, logs)
            event = prefix.with_suffix(".event.json")
            atomic_write(event, payload, root=self.root)
            for stale in (".report.json", ".exit", JOB_RECORD):  # an earlier watcher's
                prefix.with_suffix(stale).unlink(missing_ok=True)
            command = " ".join(shlex.quote(a) for a in target.render(self.site.values(d)))
            script = prefix.with_suffix(".sh")
            q = shlex.quote
            text = _SCRIPT.format(
                did=d.delivery_id.replace("\n", " "),
                attempt=k,
                command=command,
                event=q(str(event)),
                exit=q(str(prefix.with_suffix(".exit"))),
            )
            atomic_write(script, text.encode(), root=self.root)
        except OSError as exc:
            out.status, out.error = "failed", f"cannot write the job's files: {exc.strerror or exc}"
            return None
        env = command_env(d, payload, event, prefix.with_suffix(".report.json"), self.site.journal)
        digest = hashlib.sha1(f"{self.dir}/{d.file_stem}".encode()).hexdigest()[:12]
        marker: dict[str, Any] = {
            "delivery_id": d.delivery_id,
            "attempt": k,
            "job_name": f"ilab-{digest}-a{k}",
            "job_id": None,
            "prefix": str(prefix),
            "log": str(log_path),
            "owner": self.token,
            "final": None,
        }
        save(marker_path, marker, root=self.root)  # before submitting: found by name on restart
        # the watcher's cwd, as for a local command: relative paths (DIR, placeholders,
        # ILAB_CKPT_DIR) mean the same in the job, on the shared filesystem
        spec = JobSpec(marker["job_name"], script, env, log_path.absolute(), Path.cwd())
        try:
            marker["job_id"] = self.board.scheduler.submit(spec)
        except SchedulerError as exc:
            marker_path.unlink(missing_ok=True)
            out.status, out.error = "failed", str(exc)
            return None
        marker["submitted_at"] = time.time()
        save(marker_path, marker, root=self.root)
        return marker

    def _follow(
        self,
        marker_path: Path,
        marker: dict[str, Any],
        d: Delivery,
        out: DeliveryResult,
        *,
        adopted: bool,
    ) -> None:
        """Wait for the job's end (or take the one recorded) and make the result."""
        job_id = str(marker["job_id"])
        prefix = Path(marker["prefix"])
        job: dict[str, Any] = {
            "scheduler": self.board.scheduler.name,
            "id": job_id,
            "node": None,
            "states": [],
            "adopted": adopted,
        }
        out.jobs = [*(out.jobs or []), job]
        final, timed_out = marker.get("final"), False
        if final is not None:
            st = JobState(final["state"], final.get("node"), final.get("exit_code"))
            job["states"].append({"state": st.state, "at": marker.get("ended_at")})
            job["node"] = st.node
        else:
            if not adopted:
                self.records.note(job, JobState("PENDING"), d, marker)
            ended, timed_out = self._wait(job_id, prefix, job, d, marker)
            if ended is None:  # the watcher is stopping: the job runs on, a restart re-attaches
                out.status = "abandoned"
                out.error = f"watcher stopped; {job['scheduler']} job {job_id} left to run"
                return
            st = ended
            marker.update(final=vars(st), ended_at=time.time())
            save(marker_path, marker, root=self.root)
        out.status = "timeout" if timed_out else "failed"  # not a previous attempt's
        self._result(st, marker, prefix, d, out)

    def _wait(
        self, job_id: str, prefix: Path, job: dict[str, Any], d: Delivery, marker: dict[str, Any]
    ) -> tuple[JobState | None, bool]:
        timeout = d.hook.options.timeout or DEFAULT_JOB_TIMEOUT_S
        board = self.board
        name = board.scheduler.name
        last: JobState | None = None
        timed_out, cancelled, said_held = False, False, False
        running_since: float | None = None
        exit_seen: int | None = None  # the poll count when the exit file was first seen
        exit_waits = 0
        polls = board.watch(job_id, attempt_of(d.record))
        try:
            while True:
                if self.site.stop.is_set():
                    return None, False
                seen, st = board.wait(job_id, polls, board.poll_s + 1)
                answered, polls = seen != polls, seen
                # the exit file first: the command ended, whatever the scheduler says (or
                # whether it answers at all)
                code = exit_code(prefix.with_suffix(".exit"))
                if code is not None:
                    exit_seen = seen if exit_seen is None else exit_seen
                    # Unless the scheduler already said the job ended, one poll begun after
                    # the exit file was seen says whether it queued the job again (a
                    # controller restarted on an older state does); a scheduler that does
                    # not answer is waited for LOST_AFTER_POLLS times, not more.
                    fresh, said_ended = seen >= exit_seen + 2, st is not None and st.final
                    exit_waits += 1
                    if not (said_ended or fresh or exit_waits > LOST_AFTER_POLLS):
                        continue
                    if fresh and st is not None and st.state in QUEUED_STATES:
                        self._cancel_copy(job_id, code, st)
                    node = (last.node if last else None) or (st.node if st else None)
                    st = JobState("COMPLETED" if code == 0 else "FAILED", node, code)
                elif not answered:
                    continue  # no poll answered yet (a scheduler command failing, say)
                elif st is None:  # the scheduler does not know it (any more)
                    if board.unknown(job_id) < LOST_AFTER_POLLS:
                        continue
                    st = JobState("LOST")
                else:
                    if st.state in QUEUED_STATES and not cancelled and board.aborted(d.record):
                        cancelled = True  # submitted as its attempt's abort came
                        board.cancel_queued([job_id])
                    if st.held and not said_held:
                        said_held = True  # once per job: it waits, not hangs
                        self.site.notice(
                            f"{name} job {job_id} ({_what(d)}) is held ({st.reason}): it "
                            f"starts only once released (scontrol release {job_id})"
                        )
                if last is None or (st.state, st.node) != (last.state, last.node):
                    if not (st.state == "PENDING" and last is None):
                        self.records.note(job, st, d, marker)
                    last = st
                if st.state == "RUNNING" and running_since is None:
                    running_since = time.monotonic()
                if st.final:
                    return st, timed_out
                if (
                    not timed_out
                    and running_since is not None
                    and time.monotonic() - running_since > timeout
                ):
                    timed_out = True
                    job["timeout"] = timeout
                    with contextlib.suppress(SchedulerError):
                        board.scheduler.cancel([job_id])
        finally:
            board.forget(job_id)

    def _cancel_copy(self, job_id: str, code: int, st: JobState) -> None:
        """The job ended (its exit file says ``code``) but the scheduler queued it again:
        cancel that copy, so that the command never runs twice, and say so."""
        name = self.board.scheduler.name
        try:
            self.board.scheduler.cancel([job_id])
        except SchedulerError as exc:
            self.site.notice(
                f"cannot cancel {name} job {job_id}, queued again after it ended: {exc}"
            )
            return
        self.site.notice(
            f"{name} job {job_id} ended (exit code {code}) but {name} queued it again "
            f"({st.state}, {st.reason or 'requeued'}): cancelled, so that it does not run twice"
        )

    def _result(
        self, st: JobState, marker: dict[str, Any], prefix: Path, d: Delivery, out: DeliveryResult
    ) -> None:
        code = exit_code(prefix.with_suffix(".exit"))
        out.exit_code = code if code is not None else st.exit_code
        out.log_path = marker.get("log")
        with contextlib.suppress(OSError), open(str(marker["log"]), "rb") as f:
            tail = read_tail(f, OUTPUT_KEEP_BYTES).data[-_TAIL:]
            out.stdout_tail = tail.decode("utf-8", "replace")
        job_id, name = marker["job_id"], self.board.scheduler.name
        if out.status == "timeout":
            out.error = (
                f"timed out after {out.jobs[-1]['timeout']:g}s ({name} job {job_id} cancelled)"  # type: ignore[index]
            )
        elif st.state == "COMPLETED" and out.exit_code in (0, None):
            out.status, out.error = "ok", None
            report = prefix.with_suffix(".report.json")
            if report.exists():
                self.site.read_report(report, d, out)
                report.unlink(missing_ok=True)  # submitted once, also after a restart
        elif st.state == "CANCELLED" and self.board.skips(d.record):
            out.status = "skipped"
            out.error = f"{name} job {job_id} cancelled: the run was aborted"
        else:
            out.status = "failed"
            code_text = f", exit code {out.exit_code}" if out.exit_code is not None else ""
            out.error = f"{name} job {job_id} {st.state}{code_text}"
            out.stderr_tail = out.stdout_tail  # one log for both: its last line says why
        for suffix in (".sh", ".event.json", ".exit", JOB_RECORD):
            prefix.with_suffix(suffix).unlink(missing_ok=True)

    def close(self) -> None:
        """Journal what is pending (the watcher is done)."""
        self.records.close()

    def _find(self, name: str) -> str | None:
        try:
            return self.board.scheduler.find(name)
        except SchedulerError as exc:
            self.site.notice(f"cannot look up job {name}: {exc}")
            return None


def _what(d: Delivery) -> str:
    """What a delivery's job is for, in a console line: its checkpoint, or its record."""
    path = d.record["data"].get("checkpoint_path")
    return Path(path).name if isinstance(path, str) else f"{d.hook.event} seq {d.record['seq']}"
