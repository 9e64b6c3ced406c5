"""Worker entry point, run by torchrun on every rank: ``python -m trainer.rank.worker CONFIG.json``.

Opens the run journal (:class:`trainer.journaling.run_journal.RunJournal`), builds what the rank trains
with in one step (:func:`trainer.rank.startup.build_run`: process group, model with FSDP2
``fully_shard`` per block, one code path for CPU/gloo and GPU/NCCL, data, optimizer, resumed
state), runs the loop, and guarantees a ``train_end`` record on every exit path Python can see.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import socket
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

import torch.distributed as dist

from journal.rundir.lock import JournalLocked
from journal.rundir.paths import rank_log_path
from journal.rundir.procs import (
    LAUNCHER_PID_ENV,
    ORPHAN_GRACE_S,
    boot_id,
    die_with_parent,
    start_time,
    watch_parent,
)
from journal.rundir.safety import APPEND, UnsafeRunDir, open_no_follow
from trainer.checkpoint.async_save import CheckpointWriteError
from trainer.checkpoint.fit import CheckpointMismatch
from trainer.checkpoint.sharded import remove_partial_saves
from trainer.config import WorkerConfig
from trainer.data.plan import DataError
from trainer.journaling.run_journal import RunJournal
from trainer.rank.loop import RunOutcome, Trainer
from trainer.rank.startup import Built, build_run, peak_rss_mb

log = logging.getLogger("trainer")
FULL_DISK_BYTES = 1 << 20  # less free space than this after a failure: the disk is full
PEER_WAIT_S = 5.0  # a rank whose collective failed waits this long for torchrun's SIGTERM


def _setup_logging(ckpt_dir: Path, rank: int) -> None:
    sh = logging.StreamHandler(sys.stdout if rank == 0 else sys.stderr)
    sh.setFormatter(logging.Formatter(f"[rank{rank}] %(message)s"))
    sh.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    logging.raiseExceptions = False  # a full disk must not print a traceback per log line
    root.handlers[:] = [sh]
    try:  # never through a symlink planted in logs/: said once, the run goes on
        fd = open_no_follow(rank_log_path(ckpt_dir, rank), APPEND, root=ckpt_dir)
    except UnsafeRunDir as exc:
        return log.warning("no log file: %s", exc)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    fh = logging.StreamHandler(open(fd, "a", encoding="utf-8"))  # noqa: SIM115 - kept open
    fh.setFormatter(fmt)
    root.handlers.append(fh)


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


def run_worker(cfg: WorkerConfig) -> int:
    """Train on this rank; returns the exit code. Every failure after the journal is open
    ends in a ``train_end`` record with status ``failed``."""
    args = cfg.args
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ckpt_dir = Path(args.ckpt_dir)
    journal = RunJournal(
        ckpt_dir,
        main=rank == 0,
        role="trainer",
        detail=args.journal_detail,
        keep_best=args.keep_best,
    )
    _setup_logging(ckpt_dir, rank)
    journal.catch_signals()
    _end_with_launcher()
    try:
        # Rank 0 waits out a previous attempt's workers that are still finishing (after
        # their launcher was killed they save and end within seconds), then decides.
        resume_from = journal.open(resume=args.resume, relaunch=cfg.restart > 0)
        if rank == 0:
            for partial in remove_partial_saves(ckpt_dir):
                log.warning("removed %s: a save the previous attempt did not finish", partial)
    except JournalLocked as exc:
        log.error("%s", exc)
        return 1
    except Exception:
        log.exception("cannot open the journal in %s", ckpt_dir)
        return 1
    try:
        built = build_run(
            cfg, rank=rank, world=world, local_rank=local_rank, resume_from=resume_from
        )
        progress = Path(cfg.callback_progress) if cfg.callback_progress else None
        trainer = Trainer(args, built, journal, progress)
        begin_step = built.state.step
        ranks = _rank_processes(rank, local_rank, world)  # every rank takes part
        journal.begin(_config(cfg), **_begin_fields(built), ranks=ranks, restart=cfg.restart)
        outcome: RunOutcome = trainer.run()
        end = {"status": outcome.status, "reason": outcome.reason}
        end["final_checkpoint"] = outcome.final_checkpoint
        journal.end({**end, **outcome.extra}, step_time_s=trainer.step_time_s)
        log.info(
            "training %s: %s; %d steps in %.4fs of step time; peak host RSS %d MB",
            outcome.status,
            outcome.reason,
            trainer.state.step - begin_step,
            trainer.step_time_s,
            peak_rss_mb(),
        )
        return 0
    except BaseException as exc:
        if _collective_failed(exc) and os.environ.get(LAUNCHER_PID_ENV):
            # Most often another rank ended first (killed, out of memory, its own error):
            # only torchrun learns which and how, and the launcher journals the ending
            # from it (trainer/launch/recovery.py). Torchrun's SIGTERM comes once it saw a
            # rank end: waiting for it, this rank is never taken for the first.
            log.exception("a collective failed: the launcher names the rank that ended first")
            deadline = time.monotonic() + PEER_WAIT_S
            while not journal.interrupted and time.monotonic() < deadline:
                time.sleep(0.05)
            return 1
        why = None
        if isinstance(exc, DataError):
            log.error("data error: %s", exc)
        elif _disk_full(exc, ckpt_dir):  # not a bug: one line (the traceback is journaled)
            why = f"No space left on device in {ckpt_dir}"
            log.error("training failed: %s", why)
        elif isinstance(exc, (CheckpointWriteError, CheckpointMismatch)):  # no bug: one line
            why = str(exc)
            log.error("training failed: %s", why)
        else:
            log.exception("training failed")
        journal.fail(exc, why, cfg.relaunch_facts(journal.saved))
        return 1
    finally:
        journal.close()


def _config(cfg: WorkerConfig) -> dict[str, Any]:
    """``train_begin``'s config: every setting, callbacks by name only."""
    config = cfg.args.data_dict()
    if cfg.callbacks_named:
        config["callbacks_named"] = cfg.callbacks_named
    return config


def _begin_fields(built: Built) -> dict[str, Any]:
    """``train_begin``'s fields that ``ilab-train`` adds to every trainer's."""
    return {
        "total_steps": built.total_steps,
        "device_type": built.device.type,
        "resumed_from": str(built.resumed_from) if built.resumed_from else None,
        "backend": built.backend,
        "steps_per_epoch": built.planner.steps_per_epoch,
        "kernels": asdict(built.kernels),
        "train_samples": built.train_samples,
        **({"data": built.data_info} if built.data_info else {}),
    }


def _rank_processes(rank: int, local_rank: int, world: int) -> list[dict[str, Any]]:
    """Every rank's process (rank, local rank, host, pid, and its start time and boot, so
    that a hang guard ends this process and no other), gathered once per attempt for
    ``train_begin``: what the hang and death detectors look at, and what they dump
    (docs/alerts.md). One collective at start; none per step."""
    pid, host = os.getpid(), socket.gethostname()
    mine = {"rank": rank, "local_rank": local_rank, "host": host, "pid": pid}
    mine |= {"start": start_time(pid), "boot": boot_id()}
    if world == 1 or not dist.is_initialized():
        return [mine]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, mine)
    return [g for g in gathered if isinstance(g, dict)]


def _collective_failed(exc: BaseException) -> bool:
    """Whether a process group's collective failed: torch.distributed's errors (NCCL's, the
    store's, the network's) or gloo's, whose message names its source file."""
    return isinstance(exc, dist.DistError) or "/gloo/" in str(exc)


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


def main(argv: list[str] | None = None) -> NoReturn:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(
            "usage: python -m trainer.rank.worker CONFIG.json (launched by torchrun)",
            file=sys.stderr,
        )
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
