"""How the samples of a packed row are kept apart in attention: the cumulative lengths a
variable-length kernel takes, or a block-diagonal causal mask. The step planner builds a
:class:`Pack` for each micro-batch; :mod:`trainer.model.attention` reads it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Pack:
    """Where the samples of a packed row start and end, in the form its kernel takes.

    ``cu_seqlens``: int32 cumulative lengths ``[0, l0, l0+l1, ...]`` (varlen); ``max_len``:
    an upper bound of the sample lengths, rounded up to a power of two so a compiled block
    sees few distinct values; ``mask``: the (1, 1, T, T) block-diagonal causal mask
    (sdpa_mask only)."""

    cu_seqlens: torch.Tensor | None
    max_len: int
    mask: torch.Tensor | None

    @staticmethod
    def build(lengths: list[int], kernel: str, device: torch.device) -> Pack:
        if kernel == "varlen":
            cu = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0, dtype=torch.int32)
            return Pack(cu.to(device, non_blocking=True), _pow2(max(lengths)), None)
        # built where it is used: a 16k-token pack's mask is 256 MB
        sizes = torch.tensor(lengths, device=device)
        segment = torch.repeat_interleave(torch.arange(len(lengths), device=device), sizes)
        total = segment.numel()
        causal = torch.ones(total, total, dtype=torch.bool, device=device).tril_()
        mask = causal & (segment[:, None] == segment[None, :])
        return Pack(None, _pow2(max(lengths)), mask.reshape(1, 1, total, total))

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments a model forward passes down to its attention: HF's names for
        variable-length attention (``cu_seq_lens_q`` ...), or a 4-D mask."""
        if self.cu_seqlens is not None:
            return {
                "cu_seq_lens_q": self.cu_seqlens,
                "cu_seq_lens_k": self.cu_seqlens,
                "max_length_q": self.max_len,
                "max_length_k": self.max_len,
            }
        return {"attention_mask": self.mask}


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
