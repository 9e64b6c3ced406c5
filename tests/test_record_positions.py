"""Every record carries the position of the training state that emitted it, across a
stop and a resume (real torchrun, 2 gloo ranks): nothing in the loop tells the journal
the step, so no record can carry a stale one."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from journal import send_command
from tests.helpers import cli, records, train, train_argv, train_env, wait_for

pytestmark = pytest.mark.dist

BATCH = 64  # the demo's samples per step
ARGS = (
    *("--demo-samples", "384", "--num-epochs", "3"),  # 6 steps an epoch, 18 in all
    *("--save-every", "4", "--eval-every", "4", "--keep-best", "val_loss:min"),
)


def check_positions(recs: list[dict[str, Any]], per_epoch: int) -> None:
    """The position rules of one attempt's records: a step's records carry its step (from
    ``step_begin`` to the next one); ``samples_seen`` counts the step once its all-reduce is
    done; the epoch moves on after ``epoch_end``. A save carries the step it captured (an
    asynchronous one is journaled later); a control command, the step it was applied at."""
    begin = recs[0]
    assert begin["event"] == "train_begin" and recs[-1]["event"] == "train_end"
    step, epoch = begin["step"], begin["epoch"]  # the resumed state's (0 for a fresh run)
    assert epoch in {step // per_epoch, max(step - 1, 0) // per_epoch}
    assert begin["samples_seen"] == step * BATCH
    for r in recs[1:]:
        ev = r["event"]
        if ev == "step_begin":
            step += 1
        if ev in ("save", "checkpoint_removed"):  # an asynchronous save is journaled when
            # complete, at a later step boundary, with the position it captured (and so is
            # the rotation that follows it)
            assert r["step"] <= step and r["samples_seen"] == r["step"] * BATCH, r
            if ev == "save":
                assert Path(r["data"]["checkpoint_path"]).name == f"step-{r['step']:06d}", r
            continue
        reduced = ev not in ("step_begin", "before_optimizer_step", "after_optimizer_step")
        samples = (step if reduced else step - 1) * BATCH
        assert (r["step"], r["epoch"], r["samples_seen"]) == (step, epoch, samples), (ev, r)
        if ev == "epoch_end":
            assert r["data"]["epoch"] == epoch, r
            epoch += 1
        elif ev == "control":
            assert r["data"]["applied_at_step"] == step, r
        elif ev == "log":
            assert r["data"]["samples_seen"] == r["samples_seen"], r


@pytest.mark.extended
def test_every_record_of_a_stopped_and_resumed_run_carries_its_states_step(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(ckpt, *ARGS),
        env=train_env(step_delay=0.2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 8 for r in records(ckpt)),
            what="step 8 (past the first epoch)",
        )
        send_command(ckpt, "stop", reason="test")
        _, err = job.communicate(timeout=240)
    finally:
        job.kill()
    first = records(ckpt)
    assert first[-1]["data"]["status"] == "stopped", err[-3000:]
    stopped_at = first[-1]["step"]
    assert 8 <= stopped_at < 18
    proc = train(ckpt, *ARGS)
    assert proc.returncode == 0, proc.stderr[-3000:]

    recs = records(ckpt)
    attempts = [[r for r in recs if r["attempt"] == a] for a in (1, 2)]
    assert len(recs) == sum(map(len, attempts))
    per_epoch = recs[0]["data"]["steps_per_epoch"]
    assert per_epoch == 6
    for one in attempts:
        check_positions(one, per_epoch)
    second_begin = attempts[1][0]
    assert second_begin["step"] == stopped_at
    assert second_begin["data"]["resumed_from"].endswith(f"step-{stopped_at:06d}")
    end = recs[-1]
    assert end["data"]["status"] == "completed" and end["step"] == 18
    best = end["data"]["best_checkpoint"]  # the run journal's own, over both attempts
    saved = {r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"}
    assert best is not None and best["checkpoint_path"] in saved
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
