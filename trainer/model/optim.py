"""Optimizer and learning-rate schedule."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from trainer.config import TrainingArgs


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine down to ``min_ratio``."""

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


def build_optimizer(
    model: torch.nn.Module, args: TrainingArgs, total_steps: int, fused: bool = False
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the (sharded) trainable parameters, with warmup then cosine decay. ``fused``:
    one kernel for every parameter's update (:data:`trainer.model.kernels.FUSED_ADAMW_DEVICES`).
    Otherwise the multi-tensor (foreach) ops, asked for because torch's default off CUDA is
    the per-parameter loop: on FSDP2's DTensor parameters every op is a Python dispatch,
    and that loop costs several per parameter."""
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],  # LoRA: the adapters only
        lr=args.lr,
        betas=args.adam_betas,
        eps=args.adam_eps,
        weight_decay=args.weight_decay,
        fused=fused or None,
        foreach=None if fused else True,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, warmup_cosine(args.warmup_steps, total_steps, args.min_lr_ratio)
    )
    return opt, sched
