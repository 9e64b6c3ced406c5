"""trainer.model.fused_loss: the chunked linear+cross-entropy against the plain reference (CPU)."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from trainer.model.fused_loss import (
    IGNORE_INDEX,
    available_impls,
    default_chunk_rows,
    linear_cross_entropy,
    resolve_impl,
)

CPU = torch.device("cpu")
aten = torch.ops.aten


def _inputs(
    n: int = 45,
    d: int = 16,
    v: int = 70,
    dtype: torch.dtype = torch.float64,
    bias: bool = True,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
    w = (torch.randn(v, d, generator=g, dtype=torch.float64) / math.sqrt(d)).to(dtype)
    b = (
        torch.randn(v, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
        if bias
        else None
    )
    t = torch.randint(0, v, (n,), generator=g)
    t[8:16] = IGNORE_INDEX  # with chunk_rows=8: the second chunk is entirely ignored
    t[3] = IGNORE_INDEX
    t[-1] = IGNORE_INDEX
    return h, w.requires_grad_(), b, t


def _loss_and_grads(
    h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor, **kw: Any
) -> list[torch.Tensor]:
    loss = linear_cross_entropy(h, w, t, bias=b, **kw)
    params = [h, w] if b is None else [h, w, b]
    return [loss, *torch.autograd.grad(loss, params)]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], rtol: float) -> None:
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=rtol, atol=rtol * w.abs().max().item())


@pytest.mark.parametrize("dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("scale", [1.0, 0.37])
def test_chunked_matches_plain(dtype: torch.dtype, rtol: float, bias: bool, scale: float) -> None:
    h, w, b, t = _inputs(dtype=dtype, bias=bias)  # 45 rows: not a multiple of 8
    want = _loss_and_grads(h, w, b, t, impl="plain", logit_scale=scale)
    got = _loss_and_grads(h, w, b, t, impl="chunked", logit_scale=scale, chunk_rows=8)
    assert got[0].dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    assert got[0].dim() == 0
    _assert_close(got, want, rtol)


def test_default_chunk_is_one_chunk_for_small_inputs() -> None:
    h, w, b, t = _inputs(dtype=torch.float64)
    _assert_close(_loss_and_grads(h, w, b, t), _loss_and_grads(h, w, b, t, impl="plain"), 1e-10)


def test_batched_input_is_flattened() -> None:
    h, w, b, t = _inputs(n=6 * 7, dtype=torch.float64)
    h3 = h.detach().reshape(6, 7, -1).requires_grad_()
    t2 = t.reshape(6, 7)
    want = _loss_and_grads(h, w, b, t, impl="plain")
    got = _loss_and_grads(h3, w, b, t2, impl="chunked", chunk_rows=5)
    assert got[1].shape == (6, 7, h.shape[1])
    got[1] = got[1].reshape(h.shape)
    _assert_close(got, want, 1e-10)


@pytest.mark.parametrize("bias", [True, False])
def test_all_ignored_is_zero(bias: bool) -> None:
    h, w, b, t = _inputs(dtype=torch.float32, bias=bias)
    t = torch.full_like(t, IGNORE_INDEX)
    for impl in ("plain", "chunked"):
        loss, *grads = _loss_and_grads(h, w, b, t, impl=impl, chunk_rows=8)
        assert loss.item() == 0.0
        for g in grads:
            assert torch.count_nonzero(g) == 0 and not g.isnan().any()


def test_no_grad_gives_same_loss_and_no_graph() -> None:
    h, w, b, t = _inputs(dtype=torch.float32)
    want = linear_cross_entropy(h, w, t, bias=b, impl="plain")
    with torch.no_grad():
        got = linear_cross_entropy(h, w, t, bias=b, chunk_rows=8)
    assert got.grad_fn is None and not got.requires_grad
    torch.testing.assert_close(got, want.detach(), rtol=1e-6, atol=0)


def test_grad_output_scales_grads() -> None:
    h, w, b, t = _inputs(dtype=torch.float64)
    _, *g1 = _loss_and_grads(h, w, b, t, chunk_rows=8)
    (linear_cross_entropy(h, w, t, bias=b, chunk_rows=8) * 0.37).backward()
    for g, p in zip(g1, (h, w, b), strict=True):
        assert p is not None and p.grad is not None
        torch.testing.assert_close(p.grad, 0.37 * g, rtol=1e-12, atol=0)


def test_retain_graph_backward_twice_accumulates() -> None:
    # backward must not rescale the saved gradients in place
    h, w, b, t = _inputs(dtype=torch.float64)
    loss = linear_cross_entropy(h, w, t, bias=b, chunk_rows=8)
    (loss * 0.5).backward(retain_graph=True)
    first = h.grad.clone() if h.grad is not None else None
    (loss * 0.5).backward()
    assert first is not None and h.grad is not None
    torch.testing.assert_close(h.grad, 2 * first, rtol=1e-12, atol=0)


def test_frozen_weight_only_hidden_grad() -> None:
    h, w, _, t = _inputs(dtype=torch.float64, bias=False)
    w_frozen = w.detach()
    loss = linear_cross_entropy(h, w_frozen, t, chunk_rows=8)
    (gh,) = torch.autograd.grad(loss, [h])
    (want,) = torch.autograd.grad(linear_cross_entropy(h, w_frozen, t, impl="plain"), [h])
    torch.testing.assert_close(gh, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reentrant", [False, True])
def test_under_activation_checkpointing(reentrant: bool) -> None:
    h, w, b, t = _inputs(dtype=torch.float64)
    proj = torch.nn.Linear(h.shape[1], h.shape[1], dtype=torch.float64)

    def head(x: torch.Tensor) -> torch.Tensor:
        return linear_cross_entropy(torch.tanh(proj(x)), w, t, bias=b, chunk_rows=8)

    want = torch.autograd.grad(
        linear_cross_entropy(torch.tanh(proj(h)), w, t, bias=b, impl="plain"),
        [h, w, proj.weight],
    )
    checkpoint(head, h, use_reentrant=reentrant).backward()  # reentrant: no autograd.grad
    got = [h.grad, w.grad, proj.weight.grad]
    assert all(g is not None for g in got)
    _assert_close(got, list(want), 1e-10)  # type: ignore[arg-type]


def test_bf16_close_to_plain_bf16() -> None:
    h, w, b, t = _inputs(n=64, d=32, v=200, dtype=torch.bfloat16)
    want = _loss_and_grads(h, w, b, t, impl="plain")
    got = _loss_and_grads(h, w, b, t, chunk_rows=16)
    assert got[0].dtype == torch.float32
    assert [g.dtype for g in got[1:]] == [torch.bfloat16] * 3
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(
            g.float(), r.float(), rtol=2e-2, atol=2e-2 * r.abs().max().item()
        )


class _LargestOutput(TorchDispatchMode):
    """Records the largest tensor any op produces (forward and backward), and the GEMMs."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0
        self.gemms = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.gemms += func.overloadpacket in (aten.mm, aten.addmm, aten.addmm_)
        for o in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(o, torch.Tensor):
                self.largest = max(self.largest, o.numel())
        return out


def test_chunked_never_materialises_full_logits() -> None:
    n, d, v, rows = 256, 8, 4096, 16
    h, w, b, t = _inputs(n=n, d=d, v=v, dtype=torch.float32)
    with _LargestOutput() as mode:
        linear_cross_entropy(h, w, t, bias=b, chunk_rows=rows).backward()
    assert mode.largest <= max(rows * v, v * d, n * d) < n * v
    with _LargestOutput() as mode:
        linear_cross_entropy(h, w, t, bias=b, impl="plain").backward()
    assert mode.largest == n * v  # the check would see full logits


def test_no_grad_skips_gradient_work() -> None:
    h, w, b, t = _inputs(n=40, dtype=torch.float32)  # 5 chunks of 8
    with torch.no_grad(), _LargestOutput() as mode:
        linear_cross_entropy(h, w, t, bias=b, chunk_rows=8)
    assert mode.gemms == 5  # only the logits GEMMs
    with _LargestOutput() as mode:
        linear_cross_entropy(h, w, t, bias=b, chunk_rows=8)
    assert mode.gemms == 15  # + grad_hidden and grad_weight per chunk, done in forward


def test_default_chunk_rows() -> None:
    assert default_chunk_rows(32000) == 2048
    assert default_chunk_rows(128256) == 512
    assert default_chunk_rows(151936) == 384
    assert default_chunk_rows(256000) == 256
    assert default_chunk_rows(258) == 260096
    assert default_chunk_rows(2**26) == 1 and default_chunk_rows(2**30) == 1
    for v in (1000, 32000, 50257, 128256, 262144):
        assert default_chunk_rows(v) * v * 4 <= 256 * 2**20


def test_resolve_impl_on_cpu() -> None:
    assert resolve_impl("auto", CPU) == "chunked"
    assert resolve_impl("off", CPU) == "plain"
    assert resolve_impl("plain", CPU) == "plain"
    assert resolve_impl("chunked", CPU) == "chunked"
    with pytest.raises(ValueError, match="CUDA"):
        resolve_impl("liger", CPU)
    with pytest.raises(ValueError, match="unknown"):
        resolve_impl("fast", CPU)
    assert available_impls(CPU) == ["plain", "chunked"]


def test_bad_arguments() -> None:
    h, w, _, t = _inputs(dtype=torch.float32)
    with pytest.raises(ValueError, match="CUDA"):
        linear_cross_entropy(h, w, t, impl="liger")
    with pytest.raises(ValueError, match="unknown"):
        linear_cross_entropy(h, w, t, impl="fast")
    with pytest.raises(ValueError, match="disagree"):
        linear_cross_entropy(h, w, t[:-1])
    with pytest.raises(ValueError, match="dtypes"):
        linear_cross_entropy(h, w.double(), t)
