"""The device and backend a rank runs on, and the dtypes it computes in: bf16 is a compute
dtype only (``MixedPrecisionPolicy``/autocast), never that of the weights, grads or
optimizer state, which :func:`check_fp32_master` verifies once the optimizer has state."""

from __future__ import annotations

import torch
from torch import nn

from trainer.config import TrainingArgs


def device_and_backend(args: TrainingArgs, local_rank: int) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend 'nccl' needs CUDA, and no GPU is visible")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def compute_dtype(args: TrainingArgs, device: torch.device) -> torch.dtype:
    """bf16 when asked (any device) or by default on GPUs that have it (compute capability
    8.0 and up); fp32 otherwise."""
    if args.mixed_precision == "bf16":
        return torch.bfloat16
    if args.mixed_precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def check_fp32_master(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Raise unless every parameter, gradient and optimizer state tensor is fp32 (bf16 is
    for compute only); returns a one-line summary for the rank's log."""
    seen: dict[str, set[str]] = {"params": set(), "grads": set(), "optimizer state": set()}
    for p in model.parameters():
        seen["params"].add(str(p.dtype))
        if p.grad is not None:
            seen["grads"].add(str(p.grad.dtype))
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                seen["optimizer state"].add(str(v.dtype))
    bad = {k: v for k, v in seen.items() if v - {"torch.float32"}}
    if bad:
        raise RuntimeError(f"master weights must be fp32; found {bad}")
    return ", ".join(f"{k} {'/'.join(sorted(v)) or '-'}" for k, v in seen.items())
