"""The run's compute choices, decided once per run from the settings and the device, and
recorded in ``train_begin`` (``kernels``): packing and its attention kernel, the loss
kernel, regional compilation, the optimizer implementation.

``auto`` settings pick the fast path where it is known to run: on CUDA, padding-free packing
with variable-length flash attention, the fused (Liger) or chunked loss, ``torch.compile``
per block; on CPU, padded micro-batches (its SDPA fallback for packing is quadratic in the
pack length), the chunked loss, no compilation. AdamW runs its fused kernel on both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from trainer.config import TrainingArgs
from trainer.model.attention import attention_kernel
from trainer.model.fused_loss import resolve_impl

# Where torch has AdamW's fused kernel. On FSDP2's DTensor parameters it is one dispatch a
# step where the multi-tensor (foreach) path is about a dozen (measured on CPU:
# docs/performance.md).
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Kernels:
    """What this run computes with (every rank decides the same)."""

    packing: bool  # one row of whole samples per micro-batch, no padding
    attention: str  # varlen | sdpa_mask (packed rows); padded rows use causal SDPA
    loss: str  # plain | chunked | liger (trainer.model.fused_loss)
    compile: bool  # torch.compile per transformer block
    fused_adamw: bool  # AdamW's fused kernel (CUDA and CPU): one op for every parameter

    @property
    def pack_kernel(self) -> str | None:
        """The attention kernel packed micro-batches are built for; None when padded."""
        return self.attention if self.packing else None


def choose_kernels(args: TrainingArgs, device: torch.device, compute: torch.dtype) -> Kernels:
    """Resolve ``packing``, ``fused_loss`` and ``compile`` (``auto`` included) for ``device``
    and the compute dtype."""
    attention = attention_kernel(device, compute)
    packing = {"on": True, "off": False}.get(args.packing, attention == "varlen")
    compiled = {"on": True, "off": False}.get(args.compile, device.type == "cuda")
    return Kernels(
        packing=packing,
        attention=attention,
        loss=resolve_impl(args.fused_loss, device),
        compile=compiled,
        fused_adamw=device.type in FUSED_ADAMW_DEVICES,
    )


def compile_blocks(blocks: nn.ModuleList) -> None:
    """``torch.compile`` each block's forward, regionally as torchtitan does: one graph per
    block (identical blocks share it), FSDP's hooks and the checkpoint wrapper stay outside.
    The parameter names are unchanged (the module is not wrapped)."""
    for block in blocks:
        block.forward = torch.compile(block.forward)
