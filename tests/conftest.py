"""Shared test helpers: real subprocesses of the installed console scripts, real training
runs, and journals written through the real writer. Tests import helpers from here only."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from journal import JournalWriter, read_all
from journal.paths import journal_path

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
payloads = st.dictionaries(
    st.text(min_size=1, max_size=10),
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=8,
    ),
    max_size=5,
)
#: Journal contents for property tests: (event, payload, step) triples, odd names included.
records_st = st.lists(
    st.tuples(
        st.sampled_from(["log", "save", "step_end", "evaluate", "weird\n\u2028event"]),
        payloads,
        st.integers(0, 10**6),
    ),
    min_size=0,
    max_size=12,
)

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
#: The trainer sleeps this many seconds per step (test-only knob; see trainer.loop).
STEP_DELAY_ENV = "ILAB_TEST_STEP_DELAY"


def cli(name: str, *args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run an installed console script (``ilab-journal``, ``ilab-watch``, ``ilab-train``)."""
    exe = BIN / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )


def train_env(step_delay: float | None = None) -> dict[str, str]:
    """The environment for a training subprocess (one thread; optionally slowed down)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if step_delay:
        env[STEP_DELAY_ENV] = str(step_delay)
    return env


def train_argv(ckpt: Path, *extra: str) -> list[str]:
    """``ilab-train`` on the demo data with 2 CPU ranks."""
    return [
        str(BIN / "ilab-train"),
        "--demo",
        "--ckpt-dir",
        str(ckpt),
        "--nproc-per-node",
        "2",
        "--quiet",
        *extra,
    ]


def train(ckpt: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``ilab-train`` (demo, 2 ranks) to the end."""
    return subprocess.run(
        train_argv(ckpt, *extra), capture_output=True, text=True, timeout=timeout, env=train_env()
    )


def records(ckpt: Path) -> list[dict[str, Any]]:
    """Every complete record of a run's journal so far ([] before it exists)."""
    path = journal_path(ckpt)
    return read_all(path, final=False).records if path.exists() else []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a scheduler killing a job.

    (torchrun starts each worker in a session of its own, so a process-group kill misses them.)
    """
    import psutil

    procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(procs, timeout=30)


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
