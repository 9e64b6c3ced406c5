"""Worker entry point, run by torchrun on every rank: ``python -m trainer.worker CONFIG.json``.

Sets up the process group, model (FSDP2 ``fully_shard`` per block, one code path for CPU/gloo
and GPU/NCCL), data, optimizer and journal, runs the loop, and guarantees a ``train_end``
record on every exit path Python can see.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import socket
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from journal.lock import JournalLock, JournalLocked
from journal.paths import journal_path, logs_dir
from journal.reader import read_all
from journal.reports import BestTracker, MetricGoal, drain
from journal.rotation import latest_checkpoint
from journal.writer import JournalWriter
from trainer import checkpoint as ckpt
from trainer.checkpoint import ConsolidatedWriter
from trainer.config import TrainingArgs, WorkerConfig
from trainer.control_poller import ControlPoller, seen_ids_from_journal
from trainer.data import DataError, StepPlanner, load_jsonl, make_demo_data
from trainer.emitter import Emitter
from trainer.loop import RunOutcome, Trainer
from trainer.model import (
    VOCAB_SIZE,
    TinyGPT,
    build_hf_model,
    hf_decoder_layers,
    save_consolidated,
    save_hf_consolidated,
)
from trainer.optim import build_optimizer
from trainer.report_inbox import ReportInbox

log = logging.getLogger("trainer")
LOCK_WAIT_S = 30.0


def _setup_logging(ckpt_dir: Path, rank: int) -> None:
    logs = logs_dir(ckpt_dir)
    logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    fh = logging.FileHandler(logs / f"rank-{rank}.log")
    fh.setFormatter(fmt)
    sh = logging.StreamHandler(sys.stdout if rank == 0 else sys.stderr)
    sh.setFormatter(logging.Formatter(f"[rank{rank}] %(message)s"))
    sh.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.handlers[:] = [fh, sh]


def _install_signal_handlers(flag: list[str]) -> None:
    """SIGTERM/SIGINT: finish the step, save, end as interrupted (decided in the all-reduce)."""

    def handler(signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if not flag:
            flag.append(name)
            log.warning("%s received: finishing the step, then saving and ending", name)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _device_and_backend(args: TrainingArgs, local_rank: int) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend 'nccl' needs CUDA, and no GPU is visible")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("ilab-journal", "accelerate"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def _build_model(
    args: TrainingArgs, device: torch.device
) -> tuple[torch.nn.Module, ConsolidatedWriter]:
    """The model, FSDP2-sharded per block, and how to write its consolidated checkpoint."""
    write: ConsolidatedWriter
    if args.model_path is not None:
        model = build_hf_model(Path(args.model_path))
        blocks = hf_decoder_layers(model)
        write = partial(save_hf_consolidated, model.config)
    else:
        model = TinyGPT(args.model)
        blocks = model.shardable_blocks()
        cfg = {
            "model_type": "ilab-tinygpt",
            "model": args.model.model_dump(),
            "vocab_size": VOCAB_SIZE,
        }
        write = partial(_save_builtin, cfg=cfg)
    model.to(device)
    bf16 = device.type == "cuda" and args.mixed_precision in ("auto", "bf16")
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, write


def _save_builtin(
    out_dir: Path, state_dict: dict[str, torch.Tensor], *, cfg: dict[str, Any]
) -> None:
    save_consolidated(out_dir, state_dict, cfg)


def _open_journal(
    args: TrainingArgs, ckpt_dir: Path, rank: int, resumed: bool, lock: JournalLock
) -> tuple[Emitter, set[str]]:
    """Rank 0: take the journal lock and open the writer (a no-op emitter elsewhere).
    Returns the emitter and the control ids handled in earlier attempts."""
    if rank != 0 or args.journal_detail == "off":
        return Emitter(None, args.journal_detail), set()
    lock.acquire(timeout=LOCK_WAIT_S)  # a reporter holds it for one append at most
    jpath = journal_path(ckpt_dir)
    prior = read_all(jpath).records if jpath.exists() and args.resume == "auto" else []
    unfinished = bool(prior) and prior[-1].get("event") != "train_end"
    writer = JournalWriter(ckpt_dir, resume=resumed or unfinished)
    emitter = Emitter(writer, args.journal_detail)
    if args.keep_best:
        emitter.best = BestTracker(MetricGoal.parse(args.keep_best))
        for rec in prior:
            if rec.get("run_id") == writer.run_id:
                emitter.best.add(rec)
    return emitter, seen_ids_from_journal(prior)


def _load_data(
    args: TrainingArgs, ckpt_dir: Path, rank: int, world: int, local_rank: int
) -> tuple[StepPlanner, StepPlanner | None, int]:
    """Training and validation planners (and the training sample count)."""
    data_path, val_path = args.data_path, args.val_data_path
    if args.demo:
        demo_dir = ckpt_dir / "demo_data"
        if local_rank == 0:  # one writer per node (same seed: same bytes everywhere)
            make_demo_data(demo_dir, n_train=args.demo_samples, seed=args.seed)
        dist.barrier()
        data_path, val_path = demo_dir / "train.jsonl", val_path or demo_dir / "val.jsonl"
    assert data_path is not None  # TrainingArgs requires data_path unless demo
    vocab = VOCAB_SIZE if args.model_path is None else None
    seq = args.model.max_seq_len
    samples = load_jsonl(Path(data_path), seq, vocab)
    val = load_jsonl(Path(val_path), seq, vocab) if val_path else None
    planner = StepPlanner(
        samples, args.effective_batch_size, args.max_batch_len, world, rank, args.seed
    )
    val_planner = (
        StepPlanner(val, len(val), args.max_batch_len, world, rank, args.seed)
        if val and len(val) >= world
        else None
    )
    return planner, val_planner, len(samples)


def _total_steps(args: TrainingArgs, steps_per_epoch: int, rank: int) -> int:
    epoch_steps = steps_per_epoch * args.num_epochs
    if args.max_steps and args.max_steps > epoch_steps and rank == 0:
        log.warning(
            "max_steps %d is more than %d epoch(s) of %d steps: training ends at step %d "
            "(raise num_epochs to train longer)",
            args.max_steps,
            args.num_epochs,
            steps_per_epoch,
            epoch_steps,
        )
    return min(args.max_steps, epoch_steps) if args.max_steps else epoch_steps


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
    resume_from = latest_checkpoint(ckpt_dir) if args.resume == "auto" else None
    lock = JournalLock(ckpt_dir, role="trainer")
    try:
        emitter, seen_ids = _open_journal(args, ckpt_dir, rank, bool(resume_from), lock)
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
        device, backend = _device_and_backend(args, local_rank)
        dist.init_process_group(
            backend=backend, device_id=device if device.type == "cuda" else None
        )
        torch.manual_seed(args.seed)
        planner, val_planner, n_samples = _load_data(args, ckpt_dir, rank, world, local_rank)
        model, write_consolidated = _build_model(args, device)
        model.train()
        total = _total_steps(args, planner.steps_per_epoch, rank)
        opt, sched = build_optimizer(model, args, total)
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
                "train_samples": n_samples,
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
            "training %s: %s; %d steps in %.4fs of step time",
            outcome.status,
            outcome.reason,
            trainer.state.step - begin_step,
            trainer.step_time_s,
        )
        return 0
    except BaseException as exc:
        if isinstance(exc, DataError):
            log.error("data error: %s", exc)
        else:
            log.exception("training failed")
        if not ended:
            emitter.emit("train_end", failure_payload(exc))
        return 1
    finally:
        for inbox in (poller, reports):
            if inbox is not None:
                inbox.close()
        emitter.close()
        if lock.held:
            lock.release()
            drain(ckpt_dir, role="trainer")  # reports that came in after the last look


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


def failure_payload(exc: BaseException) -> dict[str, Any]:
    """The ``train_end`` payload of a failed attempt: the error and its traceback's tail."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "status": "failed",
        "reason": f"{type(exc).__name__}: {exc}",
        "final_checkpoint": None,
        "error_type": type(exc).__name__,
        "error_message": str(exc),
        "traceback": "\n".join(tb.strip().splitlines()[-25:]),
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
