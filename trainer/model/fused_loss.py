"""Fused "final linear layer + cross-entropy" without full-vocabulary logits.

Why: the usual ``F.cross_entropy(lm_head(h).float(), y)`` materialises an ``(N, V)`` fp32
logits tensor plus its gradient. At 16k-32k tokens per micro-batch and a 32k-256k
vocabulary that is several GB per micro-batch, often the activation-memory peak of the whole
step. Here the rows are processed in chunks: each chunk's logits are computed, turned into
the loss *and* into their gradient (``softmax - onehot``) right away, projected back onto
the hidden states and the weight, and freed before the next chunk. Only one chunk of logits
exists at a time, and backward merely rescales the gradients kept from forward.

Three implementations, all returning the *sum* of the per-token losses (the trainer divides
by its global token count itself):

* ``"plain"``: the unfused reference (full logits).
* ``"chunked"``: the pure-PyTorch chunked version below (any device, any float dtype).
* ``"liger"``: liger-kernel's Triton ``liger_fused_linear_cross_entropy`` (CUDA only; the
  optional ``gpu`` extra).

:func:`resolve_impl` is the one place that decides which of them a run uses.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from trainer.data.rows import IGNORE_INDEX

IMPLS = ("plain", "chunked", "liger")
REQUESTS = ("auto", "off", *IMPLS)

# A chunk's fp32 logits hold at most this many elements (2**26 * 4 bytes = 256 MiB).
LOGITS_BUDGET_ELEMS = 2**26
# Backward rescales gradients in row blocks of about this many elements, so casting a
# low-precision gradient through fp32 never needs a whole-tensor fp32 temporary.
_SCALE_BLOCK_ELEMS = 2**24


def default_chunk_rows(vocab_size: int) -> int:
    """Rows per chunk so one chunk of fp32 logits stays within 256 MiB.

    ``max(1, 2**26 // V)``, rounded down to a multiple of 64 (GEMM-friendly) when that is at
    least 64: 2048 rows for V=32k, 512 for V=128k, 384 for V=152k, 256 for V=256k.
    """
    rows = max(1, LOGITS_BUDGET_ELEMS // max(1, vocab_size))
    return rows - rows % 64 if rows >= 64 else rows


# --------------------------------------------------------------------------- choosing


@functools.lru_cache(maxsize=1)
def _liger_fn() -> Callable[..., torch.Tensor] | None:
    """liger-kernel's functional fused linear CE, or None when it (or Triton) won't import."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except Exception:  # ImportError, or Triton failing to initialise
        return None
    return liger_fused_linear_cross_entropy


def liger_available() -> bool:
    """Whether liger-kernel imports here (it still needs a CUDA device to run)."""
    return _liger_fn() is not None


def available_impls(device: torch.device) -> list[str]:
    """The implementations that can run on ``device``."""
    impls = ["plain", "chunked"]
    if device.type == "cuda" and liger_available():
        impls.append("liger")
    return impls


def resolve_impl(requested: str, device: torch.device) -> str:
    """Turn a requested loss implementation into the one to use on ``device``.

    ``"auto"`` picks ``"liger"`` when liger-kernel is installed and the device is CUDA (its
    Triton kernels avoid the few extra elementwise passes of the chunked version), and
    ``"chunked"`` otherwise: never ``"plain"``, whose full fp32 logits are what this module
    exists to avoid. ``"off"`` means ``"plain"``. An explicit ``"liger"`` that cannot run
    here is an error rather than a silent fallback, so a run never quietly uses a different
    loss kernel than its config says.
    """
    if requested not in REQUESTS:
        raise ValueError(f"unknown fused-loss implementation {requested!r}; use one of {REQUESTS}")
    if requested == "auto":
        return "liger" if device.type == "cuda" and liger_available() else "chunked"
    if requested == "off":
        return "plain"
    if requested == "liger":
        _check_liger(device)
    return requested


def _check_liger(device: torch.device) -> Callable[..., torch.Tensor]:
    if device.type != "cuda":
        raise ValueError(
            f"fused-loss impl 'liger' needs a CUDA device (got {device.type!r}); "
            "use 'chunked' or 'auto'"
        )
    fn = _liger_fn()
    if fn is None:
        raise ImportError(
            "fused-loss impl 'liger' needs liger-kernel (pip install 'ilab-journal[gpu]'); "
            "use 'chunked' or 'auto'"
        )
    return fn


# --------------------------------------------------------------------------- chunked


def _accum_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp32 for bf16/fp16/fp32 inputs; fp64 inputs stay fp64 (exact gradient checks).
    return torch.promote_types(dtype, torch.float32)


@functools.lru_cache(maxsize=8)
def _cuda_addmm_out_dtype(index: int | None) -> bool:
    # addmm(out_dtype=fp32) accumulates a bf16/fp16 GEMM straight into an fp32 buffer (CUDA,
    # sm80+); elsewhere a low-precision product is added to the fp32 accumulator instead.
    return torch.cuda.get_device_capability(index)[0] >= 8


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` in the accumulation dtype and ``a``, ``b`` maybe lower."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.device.type == "cuda" and _cuda_addmm_out_dtype(acc.device.index):
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.add_(torch.mm(a, b))


def _scaled(g: torch.Tensor | None, go: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """``(g * go)`` cast to ``dtype``, the multiply done in ``go``'s (fp32+) precision.

    Out of place on purpose: ``g`` is a saved tensor, and ``retain_graph`` may replay backward.
    """
    if g is None:
        return None
    if g.dtype == dtype == go.dtype:
        return g * go
    out = torch.empty(g.shape, dtype=dtype, device=g.device)
    rows = max(1, _SCALE_BLOCK_ELEMS // max(1, math.prod(g.shape[1:])))
    for s in range(0, g.shape[0], rows):
        out[s : s + rows] = g[s : s + rows].to(go.dtype) * go
    return out


class _ChunkedLinearCE(torch.autograd.Function):
    """Sum of CE over rows of ``(hidden @ weight.T + bias) * scale``; grads made in forward."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        logit_scale: float,
        chunk_rows: int,
        grad_enabled: bool,
    ) -> torch.Tensor:
        # ctx.needs_input_grad still says True under torch.no_grad, hence grad_enabled.
        need_h, need_w, need_b = (grad_enabled and n for n in ctx.needs_input_grad[:3])
        need_b = need_b and bias is not None
        n_rows, dim = hidden.shape
        vocab = weight.shape[0]
        acc = _accum_dtype(hidden.dtype)
        dev = hidden.device

        loss = torch.zeros((), dtype=acc, device=dev)
        grad_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=dev) if need_h else None
        grad_w = torch.zeros((vocab, dim), dtype=acc, device=dev) if need_w else None
        grad_b = torch.zeros((vocab,), dtype=acc, device=dev) if need_b else None
        any_grad = need_h or need_w or need_b

        for s in range(0, n_rows, chunk_rows):
            h = hidden[s : s + chunk_rows]
            t = targets[s : s + chunk_rows]
            # The GEMM in the input dtype (as nn.Linear under FSDP mixed precision), the
            # softmax in fp32. ``logits`` is our own buffer from here on: all in place.
            logits = F.linear(h, weight, bias).to(acc)
            if logit_scale != 1.0:
                logits.mul_(logit_scale)
            valid = t != IGNORE_INDEX
            safe_t = torch.where(valid, t, 0).unsqueeze(1)
            target_logit = logits.gather(1, safe_t).squeeze(1)
            # logsumexp by hand so the exp lands in ``logits`` (it becomes the softmax).
            row_max = logits.amax(dim=1, keepdim=True)
            probs = logits.sub_(row_max).exp_()
            denom = probs.sum(dim=1)
            lse = row_max.squeeze(1) + denom.log()
            loss.add_(torch.where(valid, lse - target_logit, 0).sum())
            if not any_grad:
                continue
            # d loss / d logits_unscaled = scale * (softmax - onehot), zero on ignored rows.
            row_w = valid.to(acc) * logit_scale
            d_logits = probs.mul_((row_w / denom).unsqueeze(1))
            d_logits.scatter_add_(1, safe_t, -row_w.unsqueeze(1))
            del probs, logits
            if need_b:
                assert grad_b is not None
                grad_b.add_(d_logits.sum(dim=0))
            d_lo = d_logits.to(hidden.dtype)  # matmuls in the input dtype
            del d_logits
            if need_h:
                assert grad_h is not None
                torch.mm(d_lo, weight, out=grad_h[s : s + chunk_rows])
            if need_w:
                assert grad_w is not None
                _accumulate_mm(grad_w, d_lo.t(), h)
            del d_lo

        if any_grad:
            ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        go = grad_out.to(_accum_dtype(ctx.dtypes[0]))
        # a gradient forward did not make (no bias, or not wanted) stays None
        grads = [_scaled(g, go, dt) for g, dt in zip(ctx.saved_tensors, ctx.dtypes, strict=True)]
        return (*grads, None, None, None, None)  # targets, logit_scale, chunk_rows, grad_enabled


# --------------------------------------------------------------------------- public


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    logit_scale: float = 1.0,
    impl: str = "chunked",
    chunk_rows: int | None = None,
) -> torch.Tensor:
    """Summed cross-entropy of ``logits = (hidden @ weight.T + bias) * logit_scale``.

    Args:
        hidden: ``(N, d)`` or ``(B, T, d)`` final hidden states, any float dtype (bf16 under
            FSDP mixed precision). Already shifted: row ``i`` predicts ``targets[i]``.
        weight: ``(V, d)`` LM-head weight, same dtype; inside an FSDP2 module's forward this
            is simply the unsharded parameter tensor.
        targets: ``(N,)`` / ``(B, T)`` int64 ids; ``-100`` (IGNORE_INDEX) rows are skipped.
        bias: optional ``(V,)`` head bias.
        logit_scale: multiplier on the logits (e.g. muP / Cohere-style output scaling).
        impl: ``"plain"``, ``"chunked"`` or ``"liger"`` (see :func:`resolve_impl`).
        chunk_rows: rows per chunk for ``"chunked"``; default :func:`default_chunk_rows`.

    Returns:
        A 0-dim tensor: the *sum* over non-ignored rows (0, with zero grads, if all are
        ignored), in fp32 (fp64 for fp64 inputs). ``"chunked"`` never holds more than one
        chunk of logits and does no host-device synchronisation; under ``torch.no_grad`` it
        skips all gradient work. Under activation checkpointing it just recomputes.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)} disagree"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight {tuple(weight.shape)} is not (V, {hidden.shape[-1]})")
    h2 = hidden.reshape(-1, hidden.shape[-1])
    t1 = targets.reshape(-1)

    if impl == "plain":
        logits = F.linear(h2, weight, bias) * logit_scale
        return F.cross_entropy(
            logits.to(_accum_dtype(logits.dtype)), t1, ignore_index=IGNORE_INDEX, reduction="sum"
        )
    if impl == "liger":
        fn = _check_liger(hidden.device)
        # Note: liger (0.8.5) syncs with the host twice per step: ``.item()`` on the count of
        # non-ignored targets in forward, ``torch.equal(grad_output, 1)`` in backward.
        if logit_scale != 1.0:
            # liger has no logit scale (only a tanh softcap): scale the GEMM inputs instead.
            h2 = h2 * logit_scale
            bias = None if bias is None else bias * logit_scale
        return fn(
            h2,
            weight,
            t1,
            bias=bias,
            ignore_index=IGNORE_INDEX,
            reduction="sum",
            accum_dtype=torch.float32,  # fp32 dW/db accumulators as in "chunked" (liger>=0.6.2)
        )
    if impl != "chunked":
        raise ValueError(f"unknown fused-loss implementation {impl!r}; use one of {IMPLS}")

    if weight.dtype != hidden.dtype or (bias is not None and bias.dtype != hidden.dtype):
        raise ValueError(
            f"hidden ({hidden.dtype}), weight ({weight.dtype}) and bias dtypes must match"
        )
    rows = default_chunk_rows(weight.shape[0]) if chunk_rows is None else int(chunk_rows)
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {rows}")
    # Autocast off inside: dtypes are explicit here (the GEMMs use ``out=`` buffers).
    with torch.autocast(device_type=hidden.device.type, enabled=False):
        out: torch.Tensor = _ChunkedLinearCE.apply(
            h2, weight, bias, t1.long(), float(logit_scale), rows, torch.is_grad_enabled()
        )
    return out
