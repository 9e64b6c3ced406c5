"""Attention for padded and packed (padding-free) micro-batches, for the built-in model and
for Hugging Face models (registered as the ``ilab_packed`` attention implementation).

A packed micro-batch is one row: whole samples back to back, position ids restarting at each
sample. Attention must never cross a sample boundary. Two kernels do that:

- ``varlen``: flash attention over variable-length sequences
  (``torch.nn.attention.varlen.varlen_attn``, torch >= 2.10, CUDA, bf16/fp16). It takes the
  cumulative sample lengths and does no work for the masked-out blocks.
- ``sdpa_mask``: ``scaled_dot_product_attention`` with a block-diagonal causal mask (T x T
  booleans). Correct everywhere (CPU, fp32, older torch), quadratic in the pack length.

``attention_kernel`` picks one per run; the choice is recorded in ``train_begin``. A padded
micro-batch (no pack) runs plain causal SDPA, as before.
"""

from __future__ import annotations

import inspect
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F

#: The attention implementation name HF models are built with (see ``register_hf_attention``).
HF_ATTENTION = "ilab_packed"


@cache
def varlen_available() -> bool:
    """Whether this torch has ``varlen_attn`` (torch >= 2.10)."""
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def attention_kernel(device: torch.device, compute_dtype: torch.dtype) -> str:
    """The packed-attention kernel for this run: ``varlen`` where flash attention runs
    (CUDA, bf16/fp16 compute, torch >= 2.10), else ``sdpa_mask``."""
    flash = device.type == "cuda" and compute_dtype in (torch.bfloat16, torch.float16)
    return "varlen" if flash and varlen_available() else "sdpa_mask"


@cache
def _varlen_options() -> tuple[dict[str, Any], bool]:
    """How this torch's ``varlen_attn`` asks for causal attention (``is_causal=True`` in
    2.10, ``window_size=(-1, 0)`` later), and whether it takes ``enable_gqa`` (later
    versions ask for it; before, grouped key/value heads went to the flash kernel as they
    are, which handles them natively: no copies of the key/value heads either way)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters
    causal: dict[str, Any] = (
        {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
    )
    return causal, "enable_gqa" in params


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    dropout: float = 0.0,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Causal attention of (B, H, T, D) queries over (B, H_kv, T, D) keys and values
    (H a multiple of H_kv); returns (B, T, H, D).

    With ``cu_seqlens`` (a packed row, B = 1): variable-length flash attention. With a
    4-D boolean ``attention_mask``: SDPA under that mask. Otherwise: plain causal SDPA."""
    if cu_seqlens is not None:
        from torch.nn.attention.varlen import varlen_attn

        if max_len is None or dropout:
            raise ValueError("varlen attention needs max_len and takes no dropout")
        causal, takes_gqa = _varlen_options()
        qs, ks, vs = (x[0].transpose(0, 1) for x in (q, k, v))  # (T, H, D)
        kw: dict[str, Any] = dict(causal)
        if q.shape[1] != k.shape[1] and takes_gqa:
            kw["enable_gqa"] = True  # older versions pass grouped heads to flash as they are
        out = varlen_attn(qs, ks, vs, cu_seqlens, cu_seqlens, max_len, max_len, scale=scale, **kw)
        return out.unsqueeze(0)  # type: ignore[union-attr]
    gqa = q.shape[1] != k.shape[1]
    y = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attention_mask,
        dropout_p=dropout,
        is_causal=attention_mask is None,
        scale=scale,
        enable_gqa=gqa,
    )
    return y.transpose(1, 2)


def _hf_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """HF's attention-function signature over :func:`attend`."""
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window") is not None:
        raise ValueError(
            "this model needs attention softcapping or a sliding window, which the packed "
            "attention does not implement"
        )
    mask = attention_mask if attention_mask is not None and attention_mask.dim() == 4 else None
    out = attend(
        query,
        key,
        value,
        scale=scaling,
        dropout=dropout,
        attention_mask=mask,
        cu_seqlens=kwargs.get("cu_seq_lens_q"),
        max_len=kwargs.get("max_length_q"),
    )
    return out, None


def register_hf_attention() -> str:
    """Make ``ilab_packed`` a valid ``attn_implementation`` for transformers; returns it.
    transformers builds no mask for an implementation it does not know (so nothing is
    built per layer), and passes a 4-D mask and the ``cu_seq_lens`` keywords through."""
    from transformers import AttentionInterface

    AttentionInterface.register(HF_ATTENTION, _hf_attention)
    return HF_ATTENTION
