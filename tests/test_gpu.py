"""ilab-train on CUDA: NCCL, bf16 compute over fp32 masters, device memory in the journal,
resume exactness, asynchronous saves. Marked ``gpu``: they run where CUDA is present
(``make test-gpu``, and in ``make test``) and skip with the reason elsewhere (conftest).

One rank each: NCCL cannot put two ranks on one GPU, so the multi-rank cases stay on gloo
(the rest of the suite). Each test trains a few steps of the built-in demo. New CUDA cases
go in a section of their own below, built on :func:`gpu_train`.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from journal.record.schema import parse_record
from journal.rundir.paths import logs_dir
from tests.helpers import BIN, ROOT, cli, real_gpu_env, records, train_env, wait_for

pytestmark = [pytest.mark.gpu, pytest.mark.dist, pytest.mark.timeout(600)]

FP32_MASTERS = "precision: params torch.float32, grads torch.float32, optimizer state torch.float32"


def gpu_argv(ckpt: Path, *extra: str) -> list[str]:
    """``ilab-train`` on the demo data: one rank on GPU 0, NCCL asked for explicitly."""
    return [
        str(BIN / "ilab-train"),
        *("--demo", "--ckpt-dir", str(ckpt)),
        *("--nproc-per-node", "1", "--backend", "nccl", "--quiet"),
        # compiling costs each launch its warm-up; the compiled path has a test of its own
        *("--compile", "off"),
        *extra,
    ]


def gpu_env(step_delay: float | None = None) -> dict[str, str]:
    """The training environment with the machine's GPUs (the suite hides them otherwise)."""
    return real_gpu_env(train_env(step_delay))


def gpu_train(ckpt: Path, *extra: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run :func:`gpu_argv` to the end; fails the test unless it exits 0."""
    proc = subprocess.run(
        gpu_argv(ckpt, *extra), capture_output=True, text=True, timeout=timeout, env=gpu_env()
    )
    assert proc.returncode == 0, why(ckpt, proc.stderr)
    return proc


def why(ckpt: Path, stderr: str) -> str:
    """The launcher's stderr and the end of the workers' output (--quiet keeps it in logs/)."""
    launch_logs = sorted(logs_dir(ckpt).glob("launch-*.log"))
    tail = launch_logs[-1].read_text(errors="replace")[-3000:] if launch_logs else ""
    return f"{stderr[-2000:]}\n--- {launch_logs[-1] if launch_logs else 'no launch log'}:\n{tail}"


def logged(ckpt: Path, attempt: int | None = None) -> list[dict[str, Any]]:
    """The ``log`` records of a run (of one attempt if given)."""
    return [
        r
        for r in records(ckpt)
        if r["event"] == "log" and (attempt is None or r["attempt"] == attempt)
    ]


# -- NCCL and device memory --------------------------------------------------------------


def test_single_rank_nccl_run_journals_device_and_memory(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    gpu_train(ckpt, "--max-steps", "6", "--profile-steps", "5:6")
    recs = records(ckpt)
    for r in recs:
        parse_record(r)  # every payload validates against its model
    begin = recs[0]["data"]
    assert begin["backend"] == "nccl" and begin["device_type"] == "cuda"
    assert begin["world_size"] == 1
    logs = logged(ckpt)
    assert [r["step"] for r in logs] == list(range(1, 7))
    for r in logs:
        now, peak = r["data"]["cuda_mem_allocated"], r["data"]["cuda_max_mem_allocated"]
        assert isinstance(now, int) and now > 0, r
        assert isinstance(peak, int) and peak >= now, r  # the step's peak, at least what stays
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
    # --profile-steps on CUDA: kernels recorded, and the share of the step they kept it busy
    summary = (ckpt / "logs" / "profile" / "rank-0-steps-5-6.txt").read_text()
    headline = summary.splitlines()[0]
    busy = r"device busy [0-9.]+ s a step \(\d+ %\)"
    assert re.fullmatch(rf"steps 5-6: [0-9.]+ s a step \(under the profiler\); {busy}", headline)
    assert "Self CUDA" in summary or "Self Device" in summary


# -- bf16 compute, fp32 masters -----------------------------------------------------------


def test_bf16_compute_keeps_fp32_masters(tmp_path: Path) -> None:
    """The rank's own check after the first step says params, grads and AdamW state are
    fp32; the losses differ from an fp32 run's (bf16 did compute) but only by rounding."""
    losses = {}
    for precision in ("bf16", "fp32"):
        ckpt = tmp_path / precision
        gpu_train(ckpt, "--max-steps", "3", "--mixed-precision", precision)
        assert records(ckpt)[0]["data"]["config"]["mixed_precision"] == precision
        assert FP32_MASTERS in (logs_dir(ckpt) / "rank-0.log").read_text()
        losses[precision] = [r["data"]["loss"] for r in logged(ckpt)]
    assert losses["bf16"] != losses["fp32"]
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=3e-2)


# -- resume --------------------------------------------------------------------------------


def test_resume_on_cuda_gives_the_losses_of_an_uninterrupted_run(tmp_path: Path) -> None:
    """SIGTERM mid-run (the sharded state of CUDA tensors is saved), then a relaunch: every
    step after the resume has the uninterrupted run's loss. fp32 compute keeps the
    comparison as tight as on CPU (bf16 rounding would hide a small resume error)."""
    ref, victim = tmp_path / "ref", tmp_path / "victim"
    args = ("--max-steps", "12", "--save-every", "4", "--mixed-precision", "fp32")
    # the reference run trains while the victim's slowed steps sleep
    ref_proc = subprocess.Popen(
        gpu_argv(ref, *args),
        env=gpu_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    job = subprocess.Popen(
        gpu_argv(victim, *args),
        env=gpu_env(step_delay=0.3),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 3 for r in records(victim)),
            timeout=300,
            what="step 3 of the victim run",
        )
        job.terminate()  # SIGTERM to the launcher: finish the step, save, end interrupted
        _, err = job.communicate(timeout=120)
        _, ref_err = ref_proc.communicate(timeout=300)
    finally:
        job.kill()
        ref_proc.kill()
    assert job.returncode == 5, why(victim, err)
    stopped_at = records(victim)[-1]
    assert stopped_at["data"]["status"] == "interrupted" and stopped_at["step"] < 12
    assert ref_proc.returncode == 0, why(ref, ref_err)

    gpu_train(victim, *args)
    begins = [r for r in records(victim) if r["event"] == "train_begin"]
    assert [b["attempt"] for b in begins] == [1, 2]
    assert begins[1]["step"] == stopped_at["step"] and begins[1]["data"]["device_type"] == "cuda"
    ref_loss = {r["step"]: r["data"]["loss"] for r in logged(ref)}
    got_loss = {r["step"]: r["data"]["loss"] for r in logged(victim, attempt=2)}
    assert sorted(got_loss) == list(range(stopped_at["step"] + 1, 13))
    for step, loss in got_loss.items():
        assert loss == pytest.approx(ref_loss[step], rel=1e-3, abs=1e-4), step


# -- packing, the fused loss and compiled blocks on CUDA ----------------------------------

KERNEL_CHECK = r"""
import sys, torch, transformers
sys.path.insert(0, sys.argv[1])
from trainer.model.attention import register_hf_attention
from trainer.data.plan import Sample, StepPlanner
from trainer.model.lm_head import with_loss_forward
cfg = transformers.LlamaConfig(vocab_size=300, hidden_size=128, intermediate_size=256,
    num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=2,
    max_position_embeddings=256, tie_word_embeddings=False)
torch.manual_seed(0)
model = transformers.AutoModelForCausalLM.from_config(
    cfg, attn_implementation=register_hf_attention(), dtype=torch.bfloat16).cuda()
model = with_loss_forward(model, "chunked")
g = torch.Generator().manual_seed(0)
rows = [torch.randint(0, 300, (int(n),), generator=g).tolist() for n in (17, 130, 64, 5, 90)]
samples = [Sample(r, r) for r in rows]
dev = torch.device("cuda")
def run(kernel):
    planner = StepPlanner(samples, 5, 4096, 1, 0, 0, pack_kernel=kernel)
    batch = planner.collate(list(range(5)), dev)
    model.zero_grad()
    loss = model(**batch.model_kwargs())
    loss.backward()
    grad = model.model.layers[0].self_attn.q_proj.weight.grad.float().clone()
    kw = batch.model_kwargs(); kw.pop("targets")
    with torch.no_grad():
        logits = model(**kw).float()
    return loss.float().item() / batch.loss_tokens, grad, logits, batch
padded, g_pad, _, _ = run(None)
packed, g_pack, logits, batch = run("varlen")
assert batch.pack.cu_seqlens is not None  # the flash varlen kernel ran
assert abs(packed - padded) / padded < 1e-2, (packed, padded)
assert (g_pack - g_pad).norm() / g_pad.norm() < 5e-2
samples[1] = Sample([(t + 1) % 300 for t in rows[1]], rows[1])
_, _, logits2, _ = run("varlen")
cut = [0, 17, 147, 211, 216, 306]
for i in range(5):
    same = torch.equal(logits[0, cut[i]:cut[i+1]], logits2[0, cut[i]:cut[i+1]])
    assert same == (i != 1), i
print("ok", padded, packed)
"""


def test_varlen_attention_matches_padding_and_keeps_samples_apart() -> None:
    """On CUDA in bf16 the packed row runs the flash varlen kernel (grouped-query heads):
    its loss and gradients match padded rows within bf16 rounding, and changing one sample
    changes no other sample's logits."""
    proc = subprocess.run(
        [sys.executable, "-c", KERNEL_CHECK, str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        env=gpu_env(),
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]


def test_packed_fused_and_compiled_training_matches_padded_in_bf16(tmp_path: Path) -> None:
    """One rank, bf16: packed (varlen), and packed with compiled blocks and the fused loss,
    train with the losses of padded micro-batches within bf16 rounding; train_begin says
    which kernels ran."""
    runs = {
        "padded": ("--packing", "off", "--fused-loss", "off"),
        "packed": ("--packing", "on", "--fused-loss", "chunked"),
        "all": ("--packing", "on", "--fused-loss", "auto", "--compile", "on"),
    }
    losses, kernels = {}, {}
    for name, extra in runs.items():
        ckpt = tmp_path / name
        gpu_train(ckpt, "--max-steps", "4", "--mixed-precision", "bf16", *extra)
        losses[name] = [r["data"]["loss"] for r in logged(ckpt)]
        kernels[name] = records(ckpt)[0]["data"]["kernels"]
    assert kernels["padded"]["packing"] is False
    assert kernels["packed"]["packing"] is True and kernels["packed"]["attention"] == "varlen"
    assert kernels["all"]["compile"] is True and kernels["all"]["fused_adamw"] is True
    for name in ("packed", "all"):
        assert losses[name] == pytest.approx(losses["padded"], rel=2e-2), name


# -- asynchronous saves on CUDA -------------------------------------------------------------


def test_async_save_on_cuda_writes_what_a_synchronous_save_gathers(tmp_path: Path) -> None:
    """An asynchronous save stages CUDA tensors into reused pinned host buffers with
    non-blocking copies. Each checkpoint's export (made from the written shards) holds the
    weights that a synchronous save gathers from the GPU at the same step: a copy read before
    it landed, or a buffer still holding the previous save, would not. fp32 on both sides;
    the tolerance allows for CUDA's non-deterministic reductions and is far below one
    step's change, which the test checks too."""
    from safetensors.torch import load_file

    args = ("--max-steps", "6", "--save-every", "2", "--keep-last-n", "5")
    args += ("--mixed-precision", "fp32")
    exports: dict[str, dict[int, dict[str, Any]]] = {}
    for name, extra in (("async", ("--async-save",)), ("sync", ("--no-async-save",))):
        ckpt = tmp_path / name
        gpu_train(ckpt, *args, *extra)
        saves = [r for r in records(ckpt) if r["event"] == "save"]
        assert [s["step"] for s in saves] == [2, 4, 6]
        assert {s["data"].get("async", False) for s in saves} == {name == "async"}
        exports[name] = {
            s["step"]: load_file(
                str(Path(s["data"]["checkpoint_path"]) / "hf" / "model.safetensors")
            )
            for s in saves
        }
    for step in (2, 4, 6):
        got, want = exports["async"][step], exports["sync"][step]
        assert got.keys() == want.keys()
        for key in want:
            assert torch.allclose(got[key], want[key], rtol=1e-5, atol=1e-6), (step, key)
    moved = exports["sync"][4]
    assert any(
        not torch.allclose(exports["sync"][2][k], moved[k], rtol=1e-5, atol=1e-6) for k in moved
    )  # one step's change is above the tolerance: a stale buffer would fail the test
