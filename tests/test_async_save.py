"""Asynchronous checkpoints under kill -9 (bounded; ``make torture`` runs the long node-crash
torture with --async-save, the default): a kill while a background write is in flight leaves
nothing a reader takes for a checkpoint, and the relaunch resumes from the newest complete one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import kill_tree, records, train, train_argv, train_env, wait_for

pytestmark = pytest.mark.dist


def _complete(path: Path) -> bool:
    full = path / "full_state"
    return (full / "trainer_state.json").exists() and (full / ".metadata").exists()


def test_kill_9_during_background_writes_resumes_from_the_newest_complete_checkpoint(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "run"
    args = ("--max-steps", "24", "--save-every", "2", "--keep-last-n", "100")
    for kill_at in (5, 11):  # a save at every even step: its write is in flight at odd steps
        job = subprocess.Popen(
            train_argv(ckpt, *args),
            env=train_env(step_delay=0.1),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            wait_for(
                lambda k=kill_at: any(
                    r["event"] == "step_begin" and r["step"] >= k for r in records(ckpt)
                ),
                what=f"step {kill_at}",
            )
        finally:
            kill_tree(job.pid)
            job.wait()
        saved = [Path(r["data"]["checkpoint_path"]) for r in records(ckpt) if r["event"] == "save"]
        assert saved and all(_complete(p) for p in saved)  # no record names a partial write
        for d in (ckpt / "checkpoints").glob("step-*"):
            assert _complete(d), d  # only renamed, complete checkpoints carry the name
    # what a kill in the middle of a write leaves (the kills above may or may not have hit
    # one): the next start removes it and says so, before anything else is saved
    partial = ckpt / "checkpoints" / ".tmp-step-000023"
    (partial / "full_state").mkdir(parents=True, exist_ok=True)
    proc = train(ckpt, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not partial.exists()
    logged = "".join(p.read_text() for p in (ckpt / "logs").glob("*"))
    assert f"removed {partial}: a save the previous attempt did not finish" in logged
    recs = records(ckpt)
    begins = [r for r in recs if r["event"] == "train_begin"]
    assert len(begins) == 3
    for begin, prev in zip(begins[1:], begins, strict=False):
        before = [r for r in recs if r["attempt"] == prev["attempt"] and r["event"] == "save"]
        assert begin["step"] == max(r["step"] for r in before)  # the newest complete one
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
