"""Padding-free packing, the loss head and compiled blocks change speed and memory, never the
math: a packed row gives the same loss and gradients as padded rows (fp32), no sample sees
another in its pack, the fused/chunked loss equals the plain one, and training resumes on
the same samples (proven on CPU; the varlen flash kernel runs in tests/test_gpu.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import records, train
from trainer.config import ModelConfig
from trainer.data.plan import Sample, StepPlanner
from trainer.model.attention import register_hf_attention
from trainer.model.builtin import IGNORE_INDEX, TinyGPT

transformers = pytest.importorskip("transformers")
VOCAB = 258
CPU = torch.device("cpu")


def samples(n: int, lo: int, hi: int, seed: int = 0) -> list[Sample]:
    """Random token rows; the first third of each is prompt (no loss)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        ids = [rng.randrange(VOCAB) for _ in range(rng.randint(lo, hi))]
        labels = [IGNORE_INDEX] * (len(ids) // 3) + ids[len(ids) // 3 :]
        out.append(Sample(ids, labels))
    return out


def tinygpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return TinyGPT(ModelConfig(d_model=32, n_layers=2, n_heads=4, max_seq_len=64))


def llama() -> torch.nn.Module:
    from trainer.model.lm_head import with_loss_forward

    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation=register_hf_attention(), dtype=torch.float32
    )
    return with_loss_forward(model, "plain")


MODELS = {"tinygpt": tinygpt, "llama": llama}


def assert_grads_close(got: torch.Tensor, want: torch.Tensor, name: str) -> None:
    """Equal to fp32 rounding: 1e-5 of the tensor's largest entry (sums in another order
    differ in the last bits, also where an entry is near zero)."""
    tol = 1e-5 * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=tol, msg=name)


def loss_and_grads(model: torch.nn.Module, planner: StepPlanner, idx: list[int]) -> Any:
    model.zero_grad()
    batch = planner.collate(idx, CPU)
    loss = model(**batch.model_kwargs())
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), batch.loss_tokens, grads


@pytest.mark.parametrize("name", MODELS)
def test_a_packed_row_gives_the_same_loss_and_gradients_as_padded_rows(name: str) -> None:
    rows = samples(7, 3, 40)
    model = MODELS[name]()
    idx = list(range(len(rows)))
    padded = StepPlanner(rows, 7, 4096, 1, 0, 0)
    packed = StepPlanner(rows, 7, 4096, 1, 0, 0, pack_kernel="sdpa_mask")
    batch = packed.collate(idx, CPU)
    assert batch.input_ids.shape == (1, sum(len(s.input_ids) for s in rows))  # no padding
    loss_a, n_a, grads_a = loss_and_grads(model, padded, idx)
    loss_b, n_b, grads_b = loss_and_grads(model, packed, idx)
    assert n_a == n_b == sum(s.loss_tokens for s in rows)
    assert loss_b.item() == pytest.approx(loss_a.item(), rel=1e-5)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for key, g in grads_a.items():
        assert_grads_close(grads_b[key], g, key)


@pytest.mark.parametrize("name", MODELS)
def test_no_sample_sees_another_in_its_pack(name: str) -> None:
    rows = samples(4, 5, 20, seed=1)
    model = MODELS[name]().eval()
    planner = StepPlanner(rows, 4, 4096, 1, 0, 0, pack_kernel="sdpa_mask")

    def logits(batch_rows: list[Sample]) -> torch.Tensor:
        planner.samples = batch_rows
        b = planner.collate([0, 1, 2, 3], CPU)
        kw = b.model_kwargs()
        kw.pop("targets")
        with torch.no_grad():
            out = model(**kw)
        return out[0]

    before = logits(rows)
    changed = list(rows)
    changed[1] = Sample([(t + 1) % VOCAB for t in rows[1].input_ids], rows[1].labels)
    after = logits(changed)
    spans = [0, *torch.tensor([len(s.input_ids) for s in rows]).cumsum(0).tolist()]
    for i in range(4):
        a, b = before[spans[i] : spans[i + 1]], after[spans[i] : spans[i + 1]]
        if i == 1:
            assert not torch.allclose(a, b)
        else:
            assert torch.equal(a, b), f"sample {i} changed with sample 1"


@pytest.mark.parametrize("name", MODELS)
def test_the_chunked_loss_head_equals_the_plain_one(name: str) -> None:
    rows = samples(6, 3, 30, seed=2)
    planner = StepPlanner(rows, 6, 4096, 1, 0, 0, pack_kernel="sdpa_mask")
    results = {}
    for impl in ("plain", "chunked"):
        model = MODELS[name]()
        model.get_output_embeddings().impl = impl
        results[impl] = loss_and_grads(model, planner, list(range(6)))
    loss_a, _, grads_a = results["plain"]
    loss_b, _, grads_b = results["chunked"]
    assert loss_b.item() == pytest.approx(loss_a.item(), rel=1e-5)
    for key, g in grads_a.items():
        assert_grads_close(grads_b[key], g, key)


def test_the_packed_budget_counts_real_tokens() -> None:
    rows = samples(64, 5, 60, seed=3)
    plans = [
        StepPlanner(rows, 32, 200, 2, rank, 7, pack_kernel="varlen").plan(0, 1) for rank in (0, 1)
    ]
    assert plans[0] == StepPlanner(rows, 32, 200, 2, 0, 7, pack_kernel="varlen").plan(0, 1)
    assert len(plans[0].micro_batches) == len(plans[1].micro_batches)
    seen = [i for p in plans for mb in p.micro_batches for i in mb]
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 32
    lengths = [len(s.input_ids) for s in rows]
    for plan in plans:
        for mb in plan.micro_batches:
            assert sum(lengths[i] for i in mb) <= 200
    # the same samples padded need more micro-batches (the budget counts padding there)
    padded = StepPlanner(rows, 32, 200, 2, 0, 7).plan(0, 1)
    assert len(padded.micro_batches) > len(plans[0].micro_batches)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_packed_training_matches_padded_and_resumes_on_the_same_samples(tmp_path: Path) -> None:
    """2 gloo ranks, several packed micro-batches a step (padding passes where a rank has
    fewer). A packed run of 4 steps is the reference. A second run trains steps 1-2 padded,
    stops, and resumes packed for steps 3-4 (constant learning rate, so the schedule does
    not depend on --max-steps): every step has the reference's samples and loss."""
    config = tmp_path / "constant-lr.yaml"
    config.write_text("warmup_steps: 0\nmin_lr_ratio: 1.0\nsave_every: 2\n")
    common = ("--config", str(config), "--max-batch-len", "96")

    def logs(ckpt: Path) -> list[dict[str, Any]]:
        return [r for r in records(ckpt) if r["event"] == "log"]

    def kernels(ckpt: Path) -> list[dict[str, Any]]:
        return [r["data"]["kernels"] for r in records(ckpt) if r["event"] == "train_begin"]

    ref, run = tmp_path / "ref", tmp_path / "run"
    for ckpt, steps, packing in ((ref, "4", "on"), (run, "2", "off"), (run, "4", "on")):
        proc = train(ckpt, "--max-steps", steps, *common, "--packing", packing)
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert [k["packing"] for k in kernels(run)] == [False, True]
    assert kernels(ref)[0]["attention"] == "sdpa_mask"
    assert min(r["data"]["batch_metrics"]["num_minibatches"] for r in logs(ref)) > 1
    begins = [r for r in records(run) if r["event"] == "train_begin"]
    assert begins[1]["data"]["resumed_from"].endswith("step-000002")
    assert [r["step"] for r in logs(run)] == [r["step"] for r in logs(ref)] == [1, 2, 3, 4]
    for got, want in zip(logs(run), logs(ref), strict=True):
        assert (
            got["data"]["batch_metrics"]["total_length"]
            == (want["data"]["batch_metrics"]["total_length"])
        )
        assert got["data"]["loss"] == pytest.approx(want["data"]["loss"], rel=1e-5), got["step"]


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_compiled_blocks_train_with_the_same_losses() -> None:
    """``--compile``'s regional compilation (each block's forward through torch.compile,
    inductor on CPU) changes speed, not the math: three AdamW steps, the same losses."""
    from trainer.model.kernels import compile_blocks

    rows = samples(8, 12, 12, seed=4)  # one shape: one compilation
    planner = StepPlanner(rows, 8, 4096, 1, 0, 0)
    batch = planner.collate(list(range(8)), CPU)
    losses = {}
    for compiled in (False, True):
        model = tinygpt()
        if compiled:
            compile_blocks(model.blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses[compiled] = []
        for _ in range(3):
            loss = model(**batch.model_kwargs())
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[compiled].append(loss.item())
    assert losses[True] == pytest.approx(losses[False], rel=1e-5)
    assert losses[True][-1] < losses[True][0]
