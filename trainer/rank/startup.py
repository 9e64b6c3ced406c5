"""What a rank brings up before its first step, in one call (:func:`build_run`): the device
and process group, the start-up agreement of all ranks, then data, model, optimizer and the
training state (loaded from a checkpoint on resume), returned as one :class:`Built`."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from journal.rundir.safety import safe_dir
from trainer.checkpoint import sharded as ckpt
from trainer.config import WorkerConfig
from trainer.data.load import load_data, total_steps
from trainer.data.plan import StepPlanner
from trainer.model.build import build_model
from trainer.model.device import compute_dtype, device_and_backend
from trainer.model.kernels import Kernels, choose_kernels
from trainer.model.optim import build_optimizer
from trainer.model.spec import ConsolidatedWriter, model_spec

log = logging.getLogger("trainer")


class RunMismatch(RuntimeError):
    """The ranks of one run were not given the same checkpoint dir or configuration."""


@dataclass
class Built:
    """Everything the loop trains with, on this rank."""

    device: torch.device
    backend: str
    kernels: Kernels
    model: nn.Module
    write_consolidated: ConsolidatedWriter
    optimizer: torch.optim.Optimizer
    scheduler: Any
    planner: StepPlanner
    val_planner: StepPlanner | None
    total_steps: int
    train_samples: int
    data_info: dict[str, Any]  # what the data holds (chat data), for train_begin
    state: ckpt.TrainerState  # the loop's position: restored on resume
    resumed_from: Path | None


def build_run(
    cfg: WorkerConfig, *, rank: int, world: int, local_rank: int, resume_from: Path | None
) -> Built:
    """Collective (every rank): set up the process group, agree (:func:`agree`), build.
    ``resume_from`` is rank 0's decision; the other ranks follow it."""
    args = cfg.args
    device, backend = device_and_backend(args, local_rank)
    if backend == "nccl" and (pipe := os.environ.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")):
        # the flight recorder's pipes and dumps (the launcher's flight_recorder_env): NCCL
        # makes its pipe at the group's start, in a directory that must exist and be no
        # symlink (logs/ above it is checked by the launcher)
        safe_dir(Path(pipe).parent.parent, Path(pipe).parent)
    dist.init_process_group(
        backend=backend,
        device_id=device if device.type == "cuda" else None,
        timeout=timedelta(seconds=args.pg_timeout_s),
    )
    resume_from = agree(cfg, rank, world, resume_from)
    torch.manual_seed(args.seed)
    spec = model_spec(args)
    kernels = choose_kernels(args, device, compute_dtype(args, device))
    planner, val_planner, data_info = load_data(
        args, spec, Path(args.ckpt_dir), rank, world, local_rank, kernels.pack_kernel
    )
    n_samples = data_info.pop("train_samples")
    model, write_consolidated = build_model(args, spec, device, kernels)
    model.train()
    log.info("model ready (%s init): peak host RSS %d MB", args.model_init, peak_rss_mb())
    log.info("kernels: %s", kernels)
    total = total_steps(args, planner.steps_per_epoch, rank)
    opt, sched = build_optimizer(model, args, total, fused=kernels.fused_adamw)
    state = ckpt.TrainerState()
    if resume_from is not None:
        where = Path(args.ckpt_dir)  # a newest one that cannot be loaded: the one before it
        state, resume_from = ckpt.load_newest_loadable(where, resume_from, model, opt, sched)
        log.info("resumed from %s at step %d", resume_from, state.step)
    return Built(
        device=device,
        backend=backend,
        kernels=kernels,
        model=model,
        write_consolidated=write_consolidated,
        optimizer=opt,
        scheduler=sched,
        planner=planner,
        val_planner=val_planner,
        total_steps=total,
        train_samples=n_samples,
        data_info=data_info,
        state=state,
        resumed_from=resume_from,
    )


def agree(cfg: WorkerConfig, rank: int, world: int, resume_from: Path | None) -> Path | None:
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


def peak_rss_mb() -> int:
    """This process's own peak resident memory so far (Linux's VmHWM: ``ru_maxrss`` of a
    rank would count the peak of the torchrun agent that started it); 0 without ``/proc``
    (not Linux: a log line's figure, never a reason to fail a run at its end)."""
    status = Path("/proc/self/status")
    lines = status.read_text().splitlines() if status.exists() else []
    return next((int(x.split()[1]) for x in lines if x.startswith("VmHWM:")), 0) // 1024
