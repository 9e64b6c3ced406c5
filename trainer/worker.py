"""Worker entry point, run by torchrun on every rank: ``python -m trainer.worker CONFIG.json``.

Sets up the process group, model (FSDP2 ``fully_shard`` per block, one code path for CPU/gloo
and GPU/NCCL), data, optimizer and journal, runs the loop, and guarantees a ``train_end``
record on every exit path Python can see.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import platform
import shutil
import signal
import socket
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist

from journal.lock import JournalLock, JournalLocked
from journal.paths import journal_path, logs_dir
from journal.procs import ORPHAN_GRACE_S, die_with_parent, watch_parent
from journal.reader import iter_events, last_record
from journal.reports import BEST_EVENTS, BestTracker, MetricGoal, drain
from journal.rotation import latest_checkpoint
from journal.rundir import make_dir
from journal.writer import JournalWriter
from trainer import checkpoint as ckpt
from trainer.build import (
    build_model,
    compute_dtype,
    device_and_backend,
    load_data,
    model_spec,
    total_steps,
)
from trainer.config import TrainingArgs, WorkerConfig
from trainer.control_poller import ControlPoller
from trainer.data import DataError
from trainer.emitter import Emitter, failure_payload
from trainer.kernels import choose_kernels
from trainer.loop import RunOutcome, Trainer
from trainer.optim import build_optimizer
from trainer.report_inbox import ReportInbox

log = logging.getLogger("trainer")
LOCK_WAIT_S = 60.0  # for a previous attempt's orphans to save and end
RESERVE_BYTES = 256 * 1024  # for train_end (with its traceback) when the disk fills up
FULL_DISK_BYTES = 1 << 20  # less free space than this after a failure: the disk is full


class RunMismatch(RuntimeError):
    """The ranks of one run were not given the same checkpoint dir or configuration."""


def _setup_logging(ckpt_dir: Path, rank: int) -> None:
    logs = logs_dir(ckpt_dir)
    make_dir(logs)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(logs / f"rank-{rank}.log")
    fh.setFormatter(fmt)
    sh = logging.StreamHandler(sys.stdout if rank == 0 else sys.stderr)
    sh.setFormatter(logging.Formatter(f"[rank{rank}] %(message)s"))
    sh.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line
    root.handlers[:] = [fh, sh]


def _end_with_launcher() -> None:
    """Orphans must not train on: when torchrun or the launcher dies (any signal), take the
    SIGTERM path (finish the step, save, train_end interrupted) and leave for sure after
    ORPHAN_GRACE_S even if other ranks are gone and a collective hangs."""
    die_with_parent(signal.SIGTERM)

    def orphaned() -> None:
        log.warning("the launcher or torchrun is gone: finishing the step, saving, ending")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(ORPHAN_GRACE_S)
        log.error("still running %.0fs after the launcher died: exiting", ORPHAN_GRACE_S)
        logging.shutdown()
        os._exit(1)

    watch_parent(orphaned)


def _install_signal_handlers(flag: list[str]) -> None:
    """SIGTERM/SIGINT: finish the step, save, end as interrupted (decided in the all-reduce)."""

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if not flag:
            flag.append(name)
            log.warning("%s received: finishing the step, then saving and ending", name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("ilab-journal", "accelerate"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def _open_journal(
    args: TrainingArgs, ckpt_dir: Path, rank: int, resumed: bool
) -> tuple[Emitter, set[str]]:
    """Rank 0, holding the journal lock: open the writer (a no-op emitter elsewhere).
    Returns the emitter and the control ids handled in earlier attempts. What it needs from
    the journal is read in bounded memory: the last record backwards, and the few control,
    report and checkpoint records through a byte prefilter."""
    if rank != 0 or args.journal_detail == "off":
        return Emitter(None, args.journal_detail), set()
    jpath = journal_path(ckpt_dir)
    known = args.resume == "auto" and jpath.exists()
    last = last_record(jpath) if known else None
    unfinished = last is not None and last.get("event") != "train_end"
    writer = JournalWriter(ckpt_dir, resume=resumed or unfinished, reserve_bytes=RESERVE_BYTES)
    emitter = Emitter(writer, args.journal_detail)
    if args.keep_best:
        emitter.best = BestTracker(MetricGoal.parse(args.keep_best))
    seen_ids: set[str] = set()
    for rec in iter_events(jpath, {"control", *BEST_EVENTS}) if known else ():
        if rec["event"] == "control" and isinstance(rec["data"].get("id"), str):
            seen_ids.add(rec["data"]["id"])
        elif emitter.best is not None and rec.get("run_id") == writer.run_id:
            emitter.best.add(rec)
    return emitter, seen_ids


def _agree(cfg: WorkerConfig, rank: int, world: int, resume_from: Path | None) -> Path | None:
    """The one start-up collective: every rank shows its checkpoint dir and configuration,
    rank 0 its resume decision. A mismatch (e.g. nodes given different --ckpt-dir) ends
    every rank with the same clear error; otherwise everyone resumes from rank 0's choice."""
    mine = {
        "host": socket.gethostname(),
        "ckpt_dir": os.path.realpath(cfg.args.ckpt_dir),
        "config": hashlib.sha256(cfg.args.model_dump_json().encode()).hexdigest()[:16],
        "resume_from": str(resume_from) if rank == 0 and resume_from else None,
    }
    everyone: list[dict[str, Any] | None] = [None] * world
    dist.all_gather_object(everyone, mine)
    first = everyone[0]
    assert first is not None
    for r, other in enumerate(everyone):
        assert other is not None
        for key, what in (("ckpt_dir", "checkpoint dir"), ("config", "configuration")):
            if other[key] != first[key]:
                raise RunMismatch(
                    f"ranks disagree on the {what}: rank {r} on {other['host']} has "
                    f"{other[key]}, rank 0 on {first['host']} has {first[key]}"
                )
    return Path(first["resume_from"]) if first["resume_from"] else None


def run_worker(cfg: WorkerConfig) -> int:
    """Train on this rank; returns the exit code. Every failure after the journal is open
    ends in a ``train_end`` record with status ``failed``."""
    args = cfg.args
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ckpt_dir = Path(args.ckpt_dir)
    attempt_start = time.time()
    _setup_logging(ckpt_dir, rank)
    interrupted: list[str] = []
    _install_signal_handlers(interrupted)
    _end_with_launcher()
    lock = JournalLock(ckpt_dir, role="trainer")
    resume_from = None
    try:
        if rank == 0:
            # Wait out a previous attempt's workers that are still finishing (after their
            # launcher was killed they save and end within seconds), then decide.
            lock.acquire(timeout=LOCK_WAIT_S)
            resume_from = latest_checkpoint(ckpt_dir) if args.resume == "auto" else None
        emitter, seen_ids = _open_journal(args, ckpt_dir, rank, bool(resume_from))
    except JournalLocked as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("cannot open the journal in %s", ckpt_dir)
        lock.release()
        return 1
    poller: ControlPoller | None = None
    reports: ReportInbox | None = None
    ended = False
    try:
        device, backend = device_and_backend(args, local_rank)
        dist.init_process_group(
            backend=backend,
            device_id=device if device.type == "cuda" else None,
            timeout=timedelta(seconds=args.pg_timeout_s),
        )
        resume_from = _agree(cfg, rank, world, resume_from)
        torch.manual_seed(args.seed)
        spec = model_spec(args)
        kernels = choose_kernels(args, device, compute_dtype(args, device))
        planner, val_planner, data_info = load_data(
            args, spec, ckpt_dir, rank, world, local_rank, kernels.pack_kernel
        )
        n_samples = data_info.pop("train_samples")
        model, write_consolidated = build_model(args, spec, device, kernels)
        model.train()
        log.info("model ready (%s init): peak host RSS %d MB", args.model_init, _peak_rss_mb())
        log.info("kernels: %s", kernels)
        total = total_steps(args, planner.steps_per_epoch, rank)
        opt, sched = build_optimizer(model, args, total, fused=kernels.fused_adamw)
        state = ckpt.TrainerState()
        if resume_from is not None:
            state = ckpt.load_checkpoint(resume_from, model, opt, sched)
            log.info("resumed from %s at step %d", resume_from, state.step)
        if rank == 0:
            poller = ControlPoller(ckpt_dir, seen_ids, not_before=attempt_start)
            poller.start()
            if emitter.writer is not None:
                reports = ReportInbox(ckpt_dir, emitter.emit)
                reports.start()
        trainer = Trainer(
            args,
            model=model,
            optimizer=opt,
            scheduler=sched,
            planner=planner,
            val_planner=val_planner,
            emitter=emitter,
            poller=poller,
            reports=reports,
            device=device,
            state=state,
            total_steps=total,
            write_consolidated=write_consolidated,
            interrupted=interrupted,
        )
        trainer.sync_envelope()
        begin_step = state.step
        config = args.data_dict()
        if cfg.callbacks_named:
            config["callbacks_named"] = cfg.callbacks_named
        emitter.emit(
            "train_begin",
            {
                "config": config,
                "world_size": world,
                "nnodes": world // int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
                "device_type": device.type,
                "backend": backend,
                "journal_detail": args.journal_detail,
                "resumed_from": str(resume_from) if resume_from else None,
                "total_steps": total,
                "steps_per_epoch": planner.steps_per_epoch,
                "kernels": kernels.record(),
                "train_samples": n_samples,
                **({"data": data_info} if data_info else {}),
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "versions": _versions(),
            },
        )
        outcome: RunOutcome = trainer.run()
        if reports is not None:
            reports.ingest_now()  # the last reports that arrived while training
        best = emitter.best.best() if emitter.best is not None else None
        end = {
            "status": outcome.status,
            "reason": outcome.reason,
            "final_checkpoint": outcome.final_checkpoint,
            **outcome.extra,
            "best_checkpoint": best.to_dict() if best else None,
            "journal": _journal_cost(emitter, trainer),
        }
        emitter.emit("train_end", end)
        ended = True
        log.info(
            "training %s: %s; %d steps in %.4fs of step time; peak host RSS %d MB",
            outcome.status,
            outcome.reason,
            trainer.state.step - begin_step,
            trainer.step_time_s,
            _peak_rss_mb(),
        )
        return 0
    except BaseException as exc:
        why = None
        if isinstance(exc, DataError):
            log.error("data error: %s", exc)
        elif _disk_full(exc, ckpt_dir):  # not a bug: one line (the traceback is journaled)
            why = f"No space left on device in {ckpt_dir}"
            log.error("training failed: %s", why)
        else:
            log.exception("training failed")
        if not ended:
            emitter.emit("train_end", failure_payload(exc, why))
        return 1
    finally:
        for inbox in (poller, reports):
            if inbox is not None:
                inbox.close()
        emitter.close()
        if lock.held:
            lock.release()
            drain(ckpt_dir, role="trainer")  # reports that came in after the last look


def _peak_rss_mb() -> int:
    """This process's peak resident memory so far (Linux reports KiB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024


def _disk_full(exc: BaseException, ckpt_dir: Path) -> bool:
    """Whether a failure came from a full disk: ENOSPC/EDQUOT in the chain, or (torch's
    checkpoint writers report it as "unexpected pos ...") next to no free space left."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        seen = seen.__cause__ or seen.__context__
    try:
        return shutil.disk_usage(ckpt_dir).free < FULL_DISK_BYTES
    except OSError:
        return False


def _journal_cost(emitter: Emitter, trainer: Trainer) -> dict[str, Any]:
    """Directly measured time inside journal appends (train_end carries it)."""
    steps = max(trainer.state.step, 1)
    step_s = trainer.step_time_s or float("nan")
    hot_ns = emitter.append_ns - emitter.durable_ns
    return {
        "records": emitter.appends,
        "append_ns_total": emitter.append_ns,
        "append_ns_per_step": emitter.append_ns / steps,
        "hot_append_ns_per_step": hot_ns / steps,  # records on the step path, no fsync
        "durable_records": emitter.durable_appends,  # save/control records: fsynced
        "durable_ns_total": emitter.durable_ns,
        "step_time_s_total": trainer.step_time_s,
        "overhead_fraction": emitter.append_ns / 1e9 / step_s,
        "hot_overhead_fraction": hot_ns / 1e9 / step_s,
        "control_idle_ns_per_step": trainer.poll_idle_ns / max(trainer.poll_idle_steps, 1),
        "control_busy_steps": trainer.poll_busy_steps,  # steps that read new command files
        "control_busy_ns_per_step": trainer.poll_busy_ns / max(trainer.poll_busy_steps, 1),
        "control_ns_per_step": (trainer.poll_idle_ns + trainer.poll_busy_ns) / steps,
    }


def main(argv: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m trainer.worker CONFIG.json (launched by torchrun)", file=sys.stderr)
        os._exit(2)
    cfg = WorkerConfig.model_validate_json(Path(argv[0]).read_text())
    code = run_worker(cfg)
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        code = code or 1
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    # gloo's background thread can abort the interpreter at normal exit: leave directly.
    os._exit(code)


if __name__ == "__main__":
    main()
