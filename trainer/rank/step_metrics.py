"""What one step's all-reduce agrees on, and the ``log`` record made of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from trainer.data.plan import StepPlan


@dataclass(frozen=True)
class StepMetrics:
    """What the step's all-reduce agreed on, identical on every rank."""

    loss_sum: float  # summed over every rank's loss-counted tokens
    tokens: float  # loss-counted tokens, all ranks
    interrupted: bool  # a signal arrived on some rank
    commands: int  # control bits rank 0 contributed
    grad_norm: float

    @property
    def loss(self) -> float:
        return self.loss_sum / self.tokens if self.tokens else float("nan")


def log_payload(
    plan: StepPlan,
    m: StepMetrics,
    elapsed: float,
    lr: float,
    samples_seen: int,
    device: torch.device,
) -> dict[str, Any]:
    """The ``log`` record's data (schema: ``journal.record.schema.LogData``)."""
    return {
        "loss": m.loss,
        "loss_finite": math.isfinite(m.loss),
        "lr": lr,
        "grad_norm": m.grad_norm,
        "elapsed_time": elapsed,
        "tokens_per_s": plan.global_length / elapsed,
        "samples_per_s": plan.global_samples / elapsed,
        "samples_seen": samples_seen,
        "batch_metrics": {
            "total_samples": plan.global_samples,
            "total_length": plan.global_length,
            "num_loss_counted_tokens": int(m.tokens),
            "accumulated_loss": m.loss_sum,
            "grad_accum_steps": len(plan.micro_batches),
            "num_minibatches": len(plan.micro_batches),
        },
        **device_memory(device),
    }


def device_memory(device: torch.device) -> dict[str, int | None]:
    """The ``log`` record's memory fields: bytes allocated now and the step's peak (since
    :func:`reset_peak_memory` at its start); None off CUDA."""
    if device.type != "cuda":
        return {"cuda_mem_allocated": None, "cuda_max_mem_allocated": None}
    return {
        "cuda_mem_allocated": torch.cuda.memory_allocated(device),
        "cuda_max_mem_allocated": torch.cuda.max_memory_allocated(device),
    }


def reset_peak_memory(device: torch.device) -> None:
    """Start the step's peak-memory count (call first thing in each step): the ``log``
    record's ``cuda_max_mem_allocated`` is then that step's peak, what a run is sized by,
    not the peak since start-up. No-op off CUDA."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
