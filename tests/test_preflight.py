"""The launcher's preflight (trainer.launch.preflight): what it refuses, with which fix, decided
from a described machine, so the GPU cases are checked without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from trainer.config import ConfigError, TorchrunArgs, TrainingArgs
from trainer.launch import run_training
from trainer.launch.preflight import (
    Machine,
    needs_probe,
    preflight,
    problem,
    resolve_backend,
    visible_gpus,
)
from trainer.model.device import device_and_backend

V100 = "GPU 0 (Tesla V100-SXM2-16GB, compute capability 7.0)"


@pytest.mark.parametrize(
    ("backend", "precision", "nproc", "machine", "names"),
    [
        # NCCL asked for on a machine without GPUs
        ("nccl", "auto", 1, Machine(gpus=0), ["--backend nccl needs CUDA GPUs", "--backend gloo"]),
        # the reported failure: 2 ranks on one GPU, NCCL picked by auto
        (
            "auto",
            "auto",
            2,
            Machine(gpus=1),
            ["--backend auto picks NCCL", "only 1 GPU is visible", "--nproc-per-node 1"],
        ),
        (
            "nccl",
            "fp32",
            16,
            Machine(gpus=8),
            ["--nproc-per-node 16 but only 8 GPUs are", "--nproc-per-node 8", "--backend gloo"],
        ),
        (
            "auto",
            "bf16",
            1,
            Machine(gpus=1, without_bf16=(V100,)),
            ["--mixed-precision bf16 needs GPUs with bf16", V100, "--mixed-precision fp32"],
        ),
    ],
)
def test_settings_that_cannot_run_are_one_line_naming_the_fix(
    backend: str, precision: str, nproc: int, machine: Machine, names: list[str]
) -> None:
    reason = problem(backend, precision, nproc, machine)
    assert reason is not None and "\n" not in reason
    for name in names:
        assert name in reason


@pytest.mark.parametrize(
    ("backend", "precision", "nproc", "machine"),
    [
        ("auto", "auto", 2, Machine(gpus=0)),  # CPU ranks, as many as asked
        ("gloo", "bf16", 4, Machine(gpus=1, without_bf16=(V100,))),  # gloo: bf16 on the CPU
        ("auto", "auto", 1, Machine(gpus=1)),
        ("nccl", "bf16", 8, Machine(gpus=8)),
        ("auto", "auto", 2, Machine(gpus=8)),  # fewer ranks than GPUs is fine
        ("auto", "fp32", 1, Machine(gpus=1, without_bf16=(V100,))),  # bf16 not asked for
    ],
)
def test_settings_that_can_run_pass(
    backend: str, precision: str, nproc: int, machine: Machine
) -> None:
    assert problem(backend, precision, nproc, machine) is None


def test_the_machine_is_asked_only_when_the_answer_depends_on_it() -> None:
    """Where needs_probe says no (the launcher then loads no torch), every machine passes."""
    machines = [Machine(gpus=g) for g in (0, 1, 8)] + [Machine(gpus=1, without_bf16=(V100,))]
    skipped = 0
    for backend in ("auto", "gloo", "nccl"):
        for precision in ("auto", "bf16", "fp32"):
            for nproc in (1, 2, 16):
                if needs_probe(backend, precision, nproc):
                    continue
                skipped += 1
                assert all(problem(backend, precision, nproc, m) is None for m in machines)
    assert skipped == 9 + 2  # every gloo case; auto on one rank without bf16


@pytest.mark.parametrize("backend", ["auto", "gloo", "nccl"])
@pytest.mark.parametrize("gpus", [0, 2])
def test_the_preflight_and_the_workers_pick_the_same_backend(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str, gpus: int
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda _device: None)
    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, backend=backend)
    if backend == "nccl" and gpus == 0:  # refused before launch; a worker would fail
        assert problem(backend, "auto", 1, Machine(gpus=0)) is not None
        with pytest.raises(RuntimeError, match="needs CUDA"):
            device_and_backend(args, 0)
        return
    assert device_and_backend(args, 0)[1] == resolve_backend(backend, gpus)


@pytest.mark.parametrize(
    ("listed", "expected"),
    [(None, 8), ("", 0), ("-1", 0), ("0,1", 2), ("3", 1), ("0,-1,1", 1), ("0,1,2,3,4,5,6,7,8", 8)],
)
def test_visible_gpus_follow_the_workers_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, listed: str | None, expected: int
) -> None:
    """Read from the workers' environment: torch's count in this process may predate it."""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    env = {} if listed is None else {"CUDA_VISIBLE_DEVICES": listed}
    assert visible_gpus(env) == expected


def test_bf16_is_checked_on_every_gpu_the_ranks_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    capability = {0: (9, 0), 1: (7, 5)}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: capability[i])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"card{i}")
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, mixed_precision="bf16")
    preflight(args, TorchrunArgs(nproc_per_node=1), env)  # GPU 0 computes in bf16
    with pytest.raises(ConfigError, match=r"GPU 1 \(card1, compute capability 7\.5\) lacks"):
        preflight(args, TorchrunArgs(nproc_per_node=2), env)
    # the compute dtype is not checked unless bf16 is asked for explicitly
    preflight(
        args.model_copy(update={"mixed_precision": "fp32"}), TorchrunArgs(nproc_per_node=2), env
    )


def test_run_training_refuses_before_touching_the_checkpoint_dir(tmp_path: Path) -> None:
    """The Python API gets the same check as the CLI; the suite hides the GPUs (conftest)."""
    args = TrainingArgs(ckpt_dir=tmp_path / "run", demo=True, backend="nccl")
    with pytest.raises(ConfigError, match="--backend nccl needs CUDA GPUs"):
        run_training(args, TorchrunArgs(nproc_per_node=2), echo=False)
    assert not (tmp_path / "run").exists()


def test_a_lora_rank_above_the_models_hidden_size_is_refused(tmp_path: Path) -> None:
    """A LoRA rank wider than the layers it adapts used to be accepted (rank 100000 on a
    hidden size of 64 wrote a 783 MB checkpoint): one line naming both numbers, exit 2,
    read from the model's config.json before any worker starts."""
    from tests.helpers import cli

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 64, "vocab_size": 300}')
    data = tmp_path / "d.jsonl"
    data.write_text('{"input_ids": [1, 2, 3]}\n' * 70)
    run = tmp_path / "run"
    line = (
        f"lora_rank (--lora-rank) 100000 is larger than the model's hidden size 64 "
        f"(hidden_size in {model / 'config.json'}): an adapter wider than the layers it "
        "adapts adds parameters, not capacity (give --lora-rank 64 or less)"
    )
    args = TrainingArgs(ckpt_dir=run, data_path=data, model_path=model, lora_rank=100000)
    with pytest.raises(ConfigError) as err:
        run_training(args, echo=False)
    assert str(err.value) == line
    argv = ["--data", str(data), "--model-path", str(model), "--ckpt-dir", str(run)]
    proc = cli("ilab-train", *argv, "--lora-rank", "100000")
    assert proc.returncode == 2 and proc.stderr == f"ilab-train: {line}\n", proc.stderr
    assert proc.stdout == "" and not run.exists()
    preflight(args.model_copy(update={"lora_rank": 64}), TorchrunArgs())  # the width itself: ok
