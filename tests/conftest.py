"""Shared test helpers: real subprocesses of the installed console scripts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter

BIN = Path(sys.executable).parent


def cli(name: str, *args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run an installed console script (``ilab-journal``, ``ilab-watch``, ``ilab-train``)."""
    exe = BIN / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )


def wait_for(pred: Any, timeout: float = 120, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (and return that), or fail after
    ``timeout`` seconds. The tests' only way to wait: a deadline, never a bare sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_payload(step: int, loss: float = 1.0) -> dict[str, Any]:
    """A realistic ``log`` payload (~300 bytes on disk with the envelope)."""
    return {
        "loss": loss,
        "lr": 1e-4,
        "grad_norm": 0.9,
        "elapsed_time": 0.25,
        "tokens_per_s": 4096.0,
        "samples_per_s": 32.0,
        "samples_seen": step * 8,
        "batch_metrics": {
            "total_samples": 8,
            "total_length": 1024,
            "num_loss_counted_tokens": 700,
            "accumulated_loss": loss * 700,
            "grad_accum_steps": 2,
            "num_minibatches": 2,
        },
        "cuda_mem_allocated": None,
    }


def write_run(
    ckpt: Path,
    steps: int = 10,
    save_every: int = 5,
    end: str | None = "completed",
    resume: bool = False,
) -> JournalWriter:
    """Write a small but schema-valid journal of a run; returns the (closed) writer."""
    w = JournalWriter(ckpt, resume=resume)
    w.append(
        "train_begin",
        {
            "config": {"lr": 1e-4},
            "world_size": 2,
            "nnodes": 1,
            "device_type": "cpu",
            "journal_detail": "step",
            "resumed_from": None,
            "total_steps": steps,
            "hostname": "test-host",
            "pid": 1,
            "versions": {"torch": "x"},
        },
    )
    for s in range(1, steps + 1):
        w.append("step_begin", step=s - 1)
        w.append("log", log_payload(s, 2.0 / s), step=s, samples_seen=s * 8)
        if save_every and s % save_every == 0:
            w.append(
                "save",
                {
                    "checkpoint_path": str(ckpt / f"checkpoints/step-{s:06d}"),
                    "kind": ["full_state", "hf"],
                    "duration": 0.1,
                },
                step=s,
            )
        w.append("step_end", step=s, samples_seen=s * 8)
    if end:
        w.append("train_end", {"status": end, "reason": None, "final_checkpoint": None}, step=steps)
    w.close()
    return w


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir()
    return d
