"""The in-loop eval (``eval_every``): the validation loss over every rank's share of the
validation set, with one all-reduce."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from trainer.data.plan import StepPlanner


@torch.no_grad()
def validation(model: Any, planner: StepPlanner, device: torch.device) -> dict[str, Any]:
    """The ``evaluate`` record's payload: the validation loss (None without loss tokens),
    how many tokens it counts, and the seconds it took. Every rank calls it together."""
    t0 = time.perf_counter()
    model.eval()
    plan = planner.plan_indices(list(range(len(planner.samples))))
    acc = torch.zeros(2, device=device)
    for mb in plan.micro_batches:
        batch = planner.collate(mb, device)
        acc[0] += model(**batch.model_kwargs()).float()
        acc[1] += batch.loss_tokens
    dist.all_reduce(acc)
    model.train()
    total, n = acc.tolist()
    return {
        "val_loss": total / n if n else None,
        "val_num_tokens": int(n),
        "duration": time.perf_counter() - t0,
    }
