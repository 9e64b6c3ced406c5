"""``run_training``: launch torchrun workers, stream their output, report the outcome.

The launching process never runs training code. It streams worker output to the console and
``<ckpt_dir>/logs/launch-<time>.log``, and (when callbacks are given) runs the embedded
watcher that delivers journal events to them.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import IO, Any

from journal import store
from journal.channels.reports import drain
from journal.checkpoints.rotation import checkpoint_run_id, list_checkpoints
from journal.rundir.files import atomic_write
from journal.rundir.lock import JournalLocked, Locked, RunLock, describe, run_holder
from journal.rundir.paths import callbacks_progress_path, checkpoints_dir, journal_path, logs_dir
from journal.rundir.procs import LAUNCHER_PID_ENV, die_with_parent
from journal.rundir.safety import APPEND, UnsafeRunDir, check_run_dir, make_dir, open_no_follow
from journal.store import Cursor, guest
from journal.views.query import find_last
from trainer.config import ConfigError, TorchrunArgs, TrainingArgs, WorkerConfig
from trainer.launch.cluster_env import torchrun_command, torchrun_env
from trainer.launch.console import ConsoleFilter, say
from trainer.launch.data_check import check_data, start_warnings
from trainer.launch.interrupts import StoppedNow, wait_for_torchrun
from trainer.launch.preflight import preflight, resolve_backend, visible_gpus
from trainer.launch.recovery import (
    abort_marker,
    first_failure,
    hang_end,
    launch_with_restarts,
    open_launch_alerts,
    resolve_notify,
    start_guard,
)
from trainer.launch.restore import check_restore_uri, restore_if_empty
from trainer.launch.result import RunDirBusy, TrainingFailed, TrainingResult
from watcher.builtin.foreign import Progress, adapt, foreign_base, microbatch_hooks, wants_pacing
from watcher.hooks.callbacks import callable_name

#: Why a checkpoint dir cannot be made where it was asked for: a bad option (exit 2). A full
#: disk or an I/O error is not one and stays an OSError (exit 1).
_UNUSABLE_DIR_ERRNOS = frozenset(
    {
        errno.ENOENT,
        errno.ENOTDIR,
        errno.EEXIST,
        errno.EACCES,
        errno.EPERM,
        errno.EROFS,
        errno.ENAMETOOLONG,
        errno.ELOOP,
    }
)


@contextlib.contextmanager
def _checkpoint_dir_errors(ckpt_dir: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OSError that says ``ckpt_dir`` cannot be a checkpoint dir, or one another
    user could steer (:class:`UnsafeRunDir`, whose message names the fix), into a one-line
    :class:`ConfigError`."""
    try:
        yield
    except UnsafeRunDir as exc:
        raise ConfigError(str(exc)) from None
    except OSError as exc:
        if exc.errno not in _UNUSABLE_DIR_ERRNOS:
            raise
        where = "" if exc.filename in (None, os.fspath(ckpt_dir)) else f" ({exc.filename})"
        raise ConfigError(
            f"cannot use {os.fspath(ckpt_dir)} as the checkpoint dir: {exc.strerror}{where}"
        ) from None


def worker_config(
    args: TrainingArgs, progress: Path | None = None, restart: int = 0, stalled: int = 0
) -> WorkerConfig:
    """The workers' config: the plain-data args plus the callbacks' names (the callbacks
    themselves stay in this process), the paced callbacks' progress file, and the
    launcher's relaunches so far (``stalled``: the last of them that saved nothing)."""
    named = {f"on_{k}": [callable_name(cb) for cb in v] for k, v in args.hooks().items()}
    if args.callbacks:
        named["callbacks"] = [callable_name(cb) for cb in args.callbacks]
    if micro := microbatch_hooks(args.callbacks):  # why journal_detail is microbatch
        named["microbatch_hooks"] = micro
    return WorkerConfig(
        args=args,
        callbacks_named=named,
        callback_progress=str(progress) if progress else None,
        restart=restart,
        stalled=stalled,
    )


def _foreign_callbacks(
    args: TrainingArgs, ckpt_dir: Path, node_rank: int
) -> tuple[TrainingArgs, Progress | None]:
    """InstructLab's and training_hub's callbacks (watcher/builtin/foreign.py): per-micro-batch
    records where one hooks a micro-batch, and callback pacing where one hooks a step (by
    node 0's launcher: rank 0, which waits, is on node 0)."""
    if not any(foreign_base(cb) for cb in args.callbacks):
        return args, None
    if microbatch_hooks(args.callbacks) and args.journal_detail == "step":
        args = args.model_copy(update={"journal_detail": "microbatch"})
    wanted = wants_pacing(args.callbacks) and args.journal_detail != "off" and node_rank == 0
    return args, Progress(callbacks_progress_path(ckpt_dir), ckpt_dir) if wanted else None


def _pump(src: IO[bytes], log_file: IO[bytes], echo: IO[str] | None) -> None:
    """Copy worker output to the launch log and the console. A full disk or a closed
    console stops that copy (said once), never the draining: workers must not block."""
    to_log, to_echo = True, echo is not None
    console = ConsoleFilter()  # no tracebacks on the console: they stay in the log
    for line in iter(src.readline, b""):
        if to_log:
            try:
                log_file.write(line)
                log_file.flush()
            except OSError as exc:
                to_log = False
                if echo is not None:
                    echo.write(f"ilab-train: cannot write the launch log any more: {exc}\n")
        text = line.decode("utf-8", errors="replace")
        if to_echo and echo is not None and console.show(text):
            try:
                echo.write(text)
                echo.flush()
            except (OSError, ValueError):
                to_echo = False


def run_training(
    train_args: TrainingArgs,
    torchrun_args: TorchrunArgs | None = None,
    *,
    echo: bool = True,
    env: dict[str, str] | None = None,
) -> TrainingResult:
    """Run training under torchrun and return how it ended.

    Callables in ``train_args`` (``on_save=fn``, ``callbacks=[...]``) run here, in this
    process, through the embedded watcher: nothing is serialized into the workers. Returns
    after ``train_end`` and its deliveries (bounded by ``callback_grace_s``).

    Raises :class:`TrainingFailed` when the run fails (the message names the log file);
    before launching, :class:`trainer.data.rows.DataError` (naming ``file:line``) when a data file
    is malformed, :class:`trainer.config.ConfigError` when the settings cannot work here,
    the checkpoint dir cannot be created where asked or could be steered by another user,
    or ``resume="never"`` finds another run's checkpoints there, and :class:`RunDirBusy` when another launch holds the checkpoint dir.
    Ctrl-C twice raises :class:`StoppedNow` (a KeyboardInterrupt) once the end is journaled.

    With ``hang_after`` the launcher guards its workers (docs/alerts.md): a hang raises an
    alert with their stacks and, with ``hang_action="abort"``, ends the attempt, journaled as a
    hang. With ``max_restarts`` a failed or aborted attempt is launched again, resuming from
    the run's newest checkpoint.
    """
    t = torchrun_args or TorchrunArgs()
    preflight(train_args, t, env)  # before the lock, the directory or any worker
    train_args = resolve_notify(train_args)  # @FILE, $ILAB_NOTIFY: never on a command line
    check_restore_uri(train_args)
    # a dir someone else could steer: refused before anything is read or written there
    with _checkpoint_dir_errors(train_args.ckpt_dir):
        check_run_dir(train_args.ckpt_dir)
    for warning in start_warnings(train_args, check_data(train_args)):  # DataError: file:line
        say(f"warning: {warning}")
    fresh = not os.path.lexists(train_args.ckpt_dir)
    with _checkpoint_dir_errors(train_args.ckpt_dir):  # a path that cannot be a dir: exit 2
        make_dir(train_args.ckpt_dir)
    ckpt_dir = Path(train_args.ckpt_dir).resolve()
    train_args = train_args.model_copy(update={"ckpt_dir": ckpt_dir})
    # One launch per directory. Node 0's launcher holds it: the other nodes of a multi-node
    # run share the directory and must not be refused.
    run_lock = RunLock(ckpt_dir) if t.node_rank == 0 else None
    if run_lock is not None:
        try:  # a moment's wait: `ilab-journal status` probes the lock for microseconds
            run_lock.acquire(timeout=0.5)
        except Locked:
            raise RunDirBusy(_busy_message(ckpt_dir)) from None
        if run_lock.previous:
            say(
                f"warning: the previous launcher ({describe(run_lock.previous)}) ended without "
                "releasing the directory; taking over"
            )
    try:
        restore_if_empty(train_args, ckpt_dir)  # under the run lock: one restore per dir
        if train_args.resume == "never":
            _refuse_another_runs_checkpoints(ckpt_dir)
        model_path = train_args.model_path
        if model_path is not None and Path(model_path).suffix == ".gguf":
            from trainer.model.convert import convert_gguf  # once, before any worker starts

            converted = convert_gguf(Path(model_path), ckpt_dir / "model")
            train_args = train_args.model_copy(update={"model_path": converted})
        launch = partial(_launch, t=t, ckpt_dir=ckpt_dir, echo=echo, env=env)
        return launch_with_restarts(launch, train_args)
    finally:
        if run_lock is not None:  # a launch refused before it wrote anything leaves nothing
            run_lock.release(remove=os.listdir(ckpt_dir) == [run_lock.path.name])
            if fresh:
                with contextlib.suppress(OSError):  # not empty: the run's
                    ckpt_dir.rmdir()


def _refuse_another_runs_checkpoints(ckpt_dir: Path) -> None:
    """``--resume never`` starts a new run: beside another run's checkpoints a later resume,
    or a save of the same step, would mix the two. Refused before any worker starts; nothing
    is deleted."""
    if found := list_checkpoints(ckpt_dir):
        runs = sorted({r for p in found if (r := checkpoint_run_id(p))})
        raise ConfigError(
            f"--resume never: {checkpoints_dir(ckpt_dir)} holds {len(found)} checkpoints of "
            f"another run{' ' + ', '.join(runs) if runs else ''} ({found[0].name} to "
            f"{found[-1].name}); give a new --ckpt-dir for a fresh run, or --resume auto to "
            "continue that one (nothing was deleted)"
        )


def _busy_message(ckpt_dir: Path) -> str:
    info = run_holder(ckpt_dir) or {}
    begin = find_last(journal_path(ckpt_dir), "train_begin")
    if begin and begin["run_id"]:
        info = {**info, "run_id": begin["run_id"]}
    return f"{ckpt_dir} is in use by {describe(info)}"


def _launch(
    train_args: TrainingArgs,
    restart: int,
    stalled: int,
    t: TorchrunArgs,
    ckpt_dir: Path,
    *,
    echo: bool,
    env: dict[str, str] | None,
) -> TrainingResult:
    alerting = open_launch_alerts(train_args, ckpt_dir)  # a bad target: refused here
    logs = logs_dir(ckpt_dir)  # the workers read their config from here: ours alone
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cfg_path = logs / f"worker-config-{stamp}-{os.getpid()}.json"
    train_args, progress = _foreign_callbacks(train_args, ckpt_dir, t.node_rank)
    cfg = worker_config(train_args, progress.path if progress else None, restart, stalled)
    atomic_write(cfg_path, cfg.model_dump_json().encode(), root=ckpt_dir)
    log_path = logs / f"launch-{stamp}-{os.getpid()}.log"
    first_path = log_path.with_suffix(".first-failure.json")  # which rank ended first: the agent's
    journal = journal_path(ckpt_dir)
    before = journal.stat() if journal.exists() else None
    start_offset = before.st_size if before else 0

    watcher = None
    trackers = None
    exporters: list[Any] = []
    if train_args.report_to:
        from watcher.embedded import Trackers

        trackers = Trackers(ckpt_dir, list(train_args.report_to), train_args.tracker_settings)
        exporters = list(trackers.exporters.values())
    if train_args.has_callbacks() or exporters or alerting is not None:
        from watcher.embedded import EmbeddedWatcher
        from watcher.engine.cursor import CursorBusy

        try:  # `ilab-watch --name embedded` holds its cursor; a planted lock file: exit 2
            with _checkpoint_dir_errors(ckpt_dir):
                watcher = EmbeddedWatcher(
                    ckpt_dir,
                    hooks=train_args.hooks(),
                    callbacks=adapt(train_args.callbacks, progress)
                    + ([alerting.rules] if alerting is not None else []),
                    start_offset=start_offset,
                    exporters=exporters,
                    node_rank=t.node_rank,
                )
        except CursorBusy as exc:
            raise RunDirBusy(str(exc)) from None
        watcher.start()

    proc_env = torchrun_env({**os.environ, **(env or {})})  # the flags decide, not PET_*
    proc_env.setdefault("OMP_NUM_THREADS", "1")
    proc_env["PYTHONUNBUFFERED"] = "1"
    proc_env[LAUNCHER_PID_ENV] = str(os.getpid())  # workers end when this process is gone
    # here, not at the top: `python -m trainer.launch.agent` imports this package first
    from trainer.launch.agent import FIRST_FAILURE_ENV

    proc_env[FIRST_FAILURE_ENV] = str(first_path)
    # NCCL keeps a flight recorder a hang alert can dump; gloo only warns about its variable
    gpus = visible_gpus(proc_env) if train_args.backend == "auto" else 0
    if resolve_backend(train_args.backend, gpus) == "nccl":
        from watcher.alerts.evidence import flight_recorder_env

        proc_env.update(flight_recorder_env(ckpt_dir, proc_env))
    # each node guards its ranks
    sink = alerting and alerting.sink
    guard = start_guard(train_args, ckpt_dir, start_offset, sink, restart, stalled)
    try:
        with open(open_no_follow(log_path, APPEND, root=ckpt_dir), "ab") as log_file:
            proc = subprocess.Popen(
                torchrun_command(cfg_path, t),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=proc_env,
                preexec_fn=die_with_parent,  # torchrun gets SIGTERM (and stops its workers) if we die
            )
            if guard is not None and guard.launcher_pids is not None:
                guard.launcher_pids["torchrun agent"] = proc.pid  # in its view of processes
            pump = threading.Thread(
                target=_pump,
                args=(proc.stdout, log_file, sys.stdout if echo else None),
                daemon=True,
            )
            pump.start()
            rc, stopped_now = wait_for_torchrun(proc)
            pump.join(timeout=10)
    finally:
        if guard is not None:
            guard.stop()  # an abort under way finishes first
            if alerting is None:
                guard.sink.close()

    if journal.exists() and before is not None:
        now = journal.stat()
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or now.st_size < start_offset:
            start_offset = 0  # deleted and recreated during the run (journal_gap): read it all
    records = (
        store.read(journal, Cursor(start_offset), final=True).records if journal.exists() else []
    )
    end = _last(records, "train_end")
    last_save = _last(records, "save")
    if end is None and train_args.journal_detail != "off":
        # The workers are gone and wrote no train_end (killed, OOM, a collective that failed
        # when another rank ended). They were the only writer; now that they have exited,
        # record the ending so watchers and status see it: the rank torchrun saw end first.
        # A hang guard (ours or an ilab-watch's) that aborted them left a marker: a hang.
        hang = abort_marker(ckpt_dir, _last(records, "train_begin"))
        facts = cfg.relaunch_facts(last_save is not None)
        if hang is None:
            facts |= first_failure(ckpt_dir, first_path, sink.targets if sink else [])
        end = _write_fallback_end(
            ckpt_dir, rc, log_path, interrupted=stopped_now, hang=hang, facts=facts
        )
    callbacks = watcher.finish(train_args.callback_grace_s) if watcher is not None else []
    if alerting is not None:  # the rules saw train_end: what they raised is sent, or given up
        alerting.close()
    data = end["data"] if end is not None else {}
    last_log = _last(records, "log")
    result = TrainingResult(
        status=data.get("status", "completed" if rc == 0 else "failed"),
        reason=data.get("reason"),
        final_checkpoint=data.get("final_checkpoint"),
        last_metrics=last_log["data"] if last_log is not None else {},
        last_checkpoint=last_save["data"].get("checkpoint_path") if last_save else None,
        journal_path=journal,
        log_path=log_path,
        returncode=rc,
        run_id=(end or {}).get("run_id"),  # a fallback end that could not be written: none
        attempt=(end or {}).get("attempt"),
        callbacks=callbacks,
        trackers=trackers.outcomes(callbacks) if trackers else {},
    )
    if stopped_now:
        raise StoppedNow
    if result.status == "failed":
        raise TrainingFailed(
            f"training failed: {result.reason or 'unknown error'} (log: {log_path})", result
        )
    return result


def _last(records: Sequence[Mapping[str, Any]], event: str) -> Mapping[str, Any] | None:
    """The last of ``records`` with this ``event``, or None."""
    return next((r for r in reversed(records) if r["event"] == event), None)


def _write_fallback_end(
    ckpt_dir: Path,
    rc: int,
    log_path: Path,
    *,
    interrupted: bool = False,
    hang: dict[str, Any] | None = None,
    facts: Mapping[str, Any] | None = None,
) -> Mapping[str, Any]:
    """Close the workers' attempt with a ``train_end`` (they exited without one) and return
    the record as read back (``interrupted``: Ctrl-C twice ended them; ``hang``: the hang
    guard's abort marker, the attempt was aborted as hung; ``facts``: a failure's, which
    rank ended first and what follows), or, when it could not be written, its event, seq
    and payload (no envelope)."""
    reason = f"workers exited with code {rc} without writing train_end; see {log_path}"
    signalled = rc in (-signal.SIGTERM, -signal.SIGINT, 128 + signal.SIGTERM)
    payload: dict[str, Any] = {
        "status": "interrupted" if interrupted or signalled else "failed",
        "reason": reason,
        "final_checkpoint": None,
        "error_type": "WorkerExit",
        "error_message": reason,
        "traceback": None,
        "written_by": "launcher",
    }
    if hang is not None and not interrupted:  # the hang guard aborted them
        payload = hang_end(hang, rc)
    if payload["status"] == "failed":
        payload.update(facts or {})
    seq = None
    try:
        with guest(ckpt_dir, role="launcher", timeout=10) as w:
            seq = w.append("train_end", payload)  # closes their attempt
    except JournalLocked as exc:  # a worker outlived torchrun and still writes
        say(f"cannot record the workers' end: {exc}")
    drain(ckpt_dir, role="launcher")
    end = find_last(journal_path(ckpt_dir), "train_end")
    if seq is None or end is None or end["seq"] != seq:  # not written (disk full?)
        return {"event": "train_end", "seq": seq, "data": payload}
    return end
