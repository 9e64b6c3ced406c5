"""A hand-written Accelerate loop with ``JournalTracker``: the journal validates and
``ilab-journal status``/``stats`` read it; a control ``stop`` reaches the loop through
``poll_control``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli, pythonpath, records

pytest.importorskip("accelerate")

LOOP = textwrap.dedent(
    """
    import os, sys, time, torch
    from accelerate import Accelerator
    from journal import send_command
    from trainer.integrations.accelerate_tracker import JournalTracker

    run, steps, stop_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    journal = JournalTracker(run, total_steps=steps)
    acc = Accelerator(cpu=True, log_with=journal)
    acc.init_trackers("demo", config={"lr": 0.1, "steps": steps})
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = acc.prepare(model, opt)
    deadline = time.monotonic() + 30
    for step in range(1, steps + 1):
        x = torch.randn(8, 4)
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        acc.log({"loss": loss.item(), "lr": 0.1}, step=step)
        if step % 3 == 0:
            acc.save_state(f"{run}/checkpoints/step-{step:06d}")
            journal.save(f"{run}/checkpoints/step-{step:06d}", step)
        if step == stop_at:  # an operator, from another shell in real life
            send_command(run, "stop", reason="enough")
        command = journal.poll_control(step)
        if command in ("stop", "abort") or time.monotonic() > deadline:
            # one write(2) per line: under torchrun both ranks share this pipe, and a
            # print() of several parts (unbuffered) can interleave with the other rank's
            os.write(1, f"stopped at {step} {command}\\n".encode())
            break
    acc.end_training()
    """
)


#: LOOP in docs/integrations.md's shape, for torchrun: the tracker made before
#: ``Accelerator()``, no ``cpu=True``, rank 0 alone sending the stop, and gloo's ending (its
#: thread can abort the interpreter at exit, "terminate called without an active
#: exception", and fail the launch: end_training has destroyed the process group already).
#: ``STEP_DELAY`` (seconds a step, from the environment) slows it down.
DOCS_LOOP = (
    LOOP.replace("Accelerator(cpu=True, log_with=journal)", "Accelerator(log_with=journal)")
    .replace("if step == stop_at:", "if step == stop_at and torch.distributed.get_rank() == 0:")
    .replace(
        "opt.zero_grad()", 'opt.zero_grad(); time.sleep(float(os.environ.get("STEP_DELAY", 0)))'
    )
    + "import os\nsys.stdout.flush()\nos._exit(0)\n"
)


def run_loop(tmp_path: Path, steps: int, stop_at: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    return subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), str(steps), str(stop_at)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        # a bare environment, but the suite's hidden GPUs and the PYTHONPATH it runs with
        env={
            "PYTHONPATH": pythonpath(),
            "OMP_NUM_THREADS": "1",
            "PATH": "/usr/bin:/bin",
            "CUDA_VISIBLE_DEVICES": os.environ["CUDA_VISIBLE_DEVICES"],
        },
    )


@pytest.mark.extended  # the default suite's Accelerate run: the two ranks' docs-shape test
def test_accelerate_loop_journal_reads_with_status_and_stats(tmp_path: Path) -> None:
    proc = run_loop(tmp_path, steps=7, stop_at=-1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"
    assert cli("ilab-journal", "validate", str(run)).returncode == 0
    status = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
    assert status["state"] == "completed" and status["last_step"] == 7
    stats = json.loads(cli("ilab-journal", "stats", str(run), "--json").stdout)
    assert stats["counts"]["log"] == 7 and stats["counts"]["save"] == 2
    # the bridge's saves carry no duration: counted apart, never as 0 s
    assert stats["phases"]["save"] == {"count": 0, "total_s": None, "mean_s": None, "unmeasured": 2}
    recs = records(run)
    assert recs[0]["data"]["config"] == {"lr": 0.1, "steps": 7}
    assert [r["data"]["loss"] is not None for r in recs if r["event"] == "log"] == [True] * 7


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_stop_command_reaches_the_loop_through_poll_control(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = run_loop(tmp_path, steps=100_000, stop_at=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert " stop" in proc.stdout and time.monotonic() - t0 < 60
    recs = records(tmp_path / "run")
    control = [r for r in recs if r["event"] == "control"]
    assert [c["data"]["command"] for c in control] == ["stop"]
    end = recs[-1]
    assert end["data"]["status"] == "stopped"
    assert end["step"] == control[0]["data"]["applied_at_step"]


def test_two_ranks_in_the_docs_shape_journal_once_and_stop_together(tmp_path: Path) -> None:
    """docs/integrations.md's loop as written (the tracker made before ``Accelerator()``,
    no ``cpu=True``, gloo's ending) under torchrun with 2 CPU ranks: Accelerate then calls
    every rank its main process; the journal still has one writer (rank 0 of the process
    group), and a stop sent by rank 0 ends both ranks at the same step."""
    script = tmp_path / "loop.py"
    script.write_text(DOCS_LOOP)
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"),
            *(str(script), str(run), "100000", "3"),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    stops = [line for line in proc.stdout.splitlines() if line.startswith("stopped at")]
    assert len(stops) == 2 and stops[0] == stops[1] and stops[0].endswith(" stop"), stops
    recs = records(run)
    assert [r["event"] for r in recs].count("train_begin") == 1
    assert cli("ilab-journal", "validate", str(run)).returncode == 0
    end = recs[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "stopped"
    assert f"stopped at {end['step']} stop" == stops[0]


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_command_the_loop_cannot_do_is_rejected_with_its_reason(tmp_path: Path) -> None:
    """A loop that declares ``cannot={"evaluate": ...}``: an ``evaluate`` sent with a
    ``stop`` is rejected in the journal with that reason; the stop still ends the loop."""
    script = tmp_path / "loop.py"
    script.write_text(
        LOOP.replace(
            "JournalTracker(run, total_steps=steps)",
            'JournalTracker(run, total_steps=steps, cannot={"evaluate": "no eval set"})',
        ).replace(
            'send_command(run, "stop", reason="enough")',
            'send_command(run, "evaluate", command_id="e1"); '
            'send_command(run, "stop", reason="enough")',
        )
    )
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "run"), "100000", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    control = {
        r["data"]["command"]: r["data"]
        for r in records(tmp_path / "run")
        if r["event"] == "control"
    }
    assert control["evaluate"]["accepted"] is False and control["evaluate"]["id"] == "e1"
    assert control["evaluate"]["reason"] == "this Accelerate loop cannot evaluate: no eval set"
    assert control["stop"]["accepted"] is True
    assert "rejected: this Accelerate loop cannot evaluate: no eval set" in proc.stderr
