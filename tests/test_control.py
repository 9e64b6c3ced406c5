"""The control channel over real 2-rank runs: same-step application, rejections, resume,
abort, no added collectives, and the built-in callbacks stopping a real diverging run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from journal import send_command
from tests.helpers import (
    BIN,
    ROOT,
    cli,
    collective_counts,
    counting_collectives,
    pythonpath,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
)
from trainer.config import TorchrunArgs, TrainingArgs
from trainer.launch import run_training
from trainer.rank.loop import STEP_DELAY_ENV
from watcher import DivergenceDetector

pytestmark = pytest.mark.dist


def control_record(ckpt: Path, cid: str) -> dict[str, Any] | None:
    return next(
        (r for r in records(ckpt) if r["event"] == "control" and r["data"].get("id") == cid), None
    )


def send(ckpt: Path, command: str) -> str:
    proc = cli("ilab-journal", "control", command, str(ckpt), "--reason", f"test {command}")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def written_at(ckpt: Path, cid: str) -> float:
    """When a command file appeared: its mtime, kept when the trainer archived it (the time
    the CLI was started can be a few hundred ms earlier on a busy machine)."""
    return (ckpt / "control" / "processed" / f"{cid}.json").stat().st_mtime


def rank_log_steps(ckpt: Path, rank: int, command: str) -> list[int]:
    text = (ckpt / "logs" / f"rank-{rank}.log").read_text()
    return [
        int(m) for m in re.findall(rf"control [a-z+]*{command}[a-z+]* applied at step (\d+)", text)
    ]


def step_in_progress(ckpt: Path, t: float) -> int:
    """The step whose step_begin is the last one at or before time t."""
    return max(
        (r["step"] for r in records(ckpt) if r["event"] == "step_begin" and r["ts"] <= t), default=0
    )


def test_commands_apply_at_the_same_step_on_both_ranks(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "500", "--log-every", "1000"),
        env=train_env(step_delay=0.15),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 2 for r in records(ckpt)),
            what="step 2",
        )
        applied: dict[str, int] = {}
        cdir = ckpt / "control"
        for command in ("save", "evaluate", "log"):
            cid = send(ckpt, command)
            rec = wait_for(lambda cid=cid: control_record(ckpt, cid), what=f"{command} record")
            assert rec["data"]["accepted"] is True and rec["data"]["reason"] == f"test {command}"
            step = rec["data"]["applied_at_step"]
            k = step_in_progress(ckpt, written_at(ckpt, cid))
            assert k <= step <= k + 1, (command, k, step)  # the next step boundary
            applied[command] = step
        # Rejected: invalid JSON and an unknown command, written atomically by hand.
        for name, body in (
            ("bad-json", "{not json"),
            ("bad-cmd", json.dumps({"command": "explode"})),
        ):
            (cdir / f".{name}.tmp").write_text(body)
            os.rename(cdir / f".{name}.tmp", cdir / f"{name}.json")
        for name, why in (("bad-json", "invalid JSON"), ("bad-cmd", "unknown command")):
            rec = wait_for(lambda name=name: control_record(ckpt, name), what=f"{name} rejection")
            assert rec["data"]["accepted"] is False and why in rec["data"]["reason"]
        # A control dir others can write is refused (once), then works again after chmod.
        cdir.chmod(0o777)
        refused = cli("ilab-journal", "control", "save", str(ckpt))
        assert refused.returncode == 2 and "writable by its group and others" in refused.stderr
        cid = "unsafe-save"  # what another user could still drop there by hand
        (cdir / f".{cid}.tmp").write_text(json.dumps({"command": "save"}))
        os.rename(cdir / f".{cid}.tmp", cdir / f"{cid}.json")
        wait_for(
            lambda: any(
                r["event"] == "control"
                and "writable by group or others" in (r["data"].get("reason") or "")
                for r in records(ckpt)
            ),
            what="unsafe-dir rejection",
        )
        assert control_record(ckpt, cid) is None  # not applied while unsafe
        cdir.chmod(0o750)
        assert wait_for(lambda: control_record(ckpt, cid), what="save after chmod")["data"][
            "accepted"
        ]
        cid = send(ckpt, "stop")
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err[-2000:]
    recs = records(ckpt)
    by_step = {(r["event"], r["step"]) for r in recs}
    assert ("save", applied["save"]) in by_step and ("evaluate", applied["evaluate"]) in by_step
    assert ("log", applied["log"]) in by_step  # log_every=1000: only the command made it
    stop = control_record(ckpt, cid)["data"]["applied_at_step"]
    k = step_in_progress(ckpt, written_at(ckpt, cid))
    assert k <= stop <= k + 1
    end = recs[-1]
    assert (
        end["event"] == "train_end" and end["data"]["status"] == "stopped" and end["step"] == stop
    )
    assert end["data"]["final_checkpoint"].endswith(f"step-{stop:06d}")
    assert [r["step"] for r in recs if r["event"] == "save"][-1] == stop
    for command in ("save", "evaluate", "log", "stop"):
        assert rank_log_steps(ckpt, 0, command) == rank_log_steps(ckpt, 1, command), command
    assert rank_log_steps(ckpt, 0, "stop") == [stop]
    unsafe = [
        r for r in recs if r["event"] == "control" and "writable" in (r["data"].get("reason") or "")
    ]
    assert len(unsafe) == 1  # said once


@pytest.mark.extended
def test_abort_ends_without_saving_and_commands_are_not_reapplied_after_resume(
    tmp_path: Path,
) -> None:
    ckpt = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "20", "--save-every", "3"),
        env=train_env(step_delay=0.15),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: any(r["event"] == "save" for r in records(ckpt)), what="first save")
        cid = send(ckpt, "abort")
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err[-2000:]
    end = records(ckpt)[-1]["data"]
    stop_step = records(ckpt)[-1]["step"]
    assert (
        end["status"] == "stopped" and end["final_checkpoint"] is None and "abort" in end["reason"]
    )
    assert ("save", stop_step) not in {(r["event"], r["step"]) for r in records(ckpt)}
    # Simulate a crash between applying the command and archiving its file: put it back.
    shutil.copy(ckpt / "control" / "processed" / f"{cid}.json", ckpt / "control" / f"{cid}.json")
    proc = train(ckpt, "--max-steps", "20", "--save-every", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    recs = records(ckpt)
    assert recs[-1]["data"]["status"] == "completed" and recs[-1]["step"] == 20
    applied = [r for r in recs if r["event"] == "control" and r["data"]["id"] == cid]
    assert len(applied) == 1 and applied[0]["attempt"] == 1  # at most once, across the resume
    assert not (ckpt / "control" / f"{cid}.json").exists()  # archived, not left pending


def _counted_run(ckpt: Path, with_commands: bool) -> dict[str, int]:
    args = TrainingArgs(
        ckpt_dir=ckpt,
        demo=True,
        max_steps=10,
        save_final=False,
        save_at_epoch_end=False,
        log_every=1000,
    )
    job = counting_collectives(args, step_delay=0.2)
    try:
        if with_commands:
            wait_for(
                lambda: any(r["event"] == "step_end" and r["step"] >= 2 for r in records(ckpt)),
                what="step 2",
            )
            send_command(ckpt, "log", reason="exercise the channel")
            (ckpt / "control" / "junk.json").write_text("{")
            wait_for(
                lambda: sum(r["event"] == "control" for r in records(ckpt)) >= 2,
                what="two control records",
            )
        _, err = job.communicate(timeout=180)
    finally:
        job.kill()
    assert job.returncode == 0, err[-2000:]
    return collective_counts(ckpt)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_control_adds_no_collective(tmp_path: Path) -> None:
    quiet = _counted_run(tmp_path / "quiet", with_commands=False)
    busy = _counted_run(tmp_path / "busy", with_commands=True)
    accepted = [
        r for r in records(tmp_path / "busy") if r["event"] == "control" and r["data"]["accepted"]
    ]
    assert [r["data"]["command"] for r in accepted] == ["log"]  # the channel was really used
    assert busy == quiet
    # The step's single metrics all-reduce is the only one per step (10 steps).
    assert quiet["all_reduce"] == 10, quiet


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_divergence_detector_stops_a_real_run_with_a_too_high_lr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    det = DivergenceDetector(smoothing=0.5, threshold=0.5, patience=2, warmup=3)
    args = TrainingArgs(
        ckpt_dir=tmp_path / "run",
        demo=True,
        max_steps=200,
        lr=0.5,
        warmup_steps=0,
        max_grad_norm=1e6,
        callbacks=[det],
    )
    env = {STEP_DELAY_ENV: "0.05"}
    result = run_training(args, TorchrunArgs(nproc_per_node=2), echo=False, env=env)
    assert result.status == "stopped", result
    assert "divergence" in result.reason
    recs = records(tmp_path / "run")
    stop = next(r for r in recs if r["event"] == "control" and r["data"]["accepted"])
    assert "DivergenceDetector" in stop["data"]["source"] and stop["data"]["command"] == "stop"
    assert recs[-1]["step"] < 200


@pytest.mark.extended
def test_eval_script_beside_training_runs_once_per_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            "--on-save",
            str(ROOT / "examples" / "eval_accuracy.py"),
        ],
        env={**os.environ, "PYTHONPATH": pythonpath()},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc = train(ckpt, "--max-steps", "12", "--save-every", "4")
        assert proc.returncode == 0, proc.stderr[-2000:]
        code = watcher.wait(timeout=180)
    finally:
        watcher.kill()
    assert code == 0, watcher.stderr.read()
    saves = [r["data"]["checkpoint_path"] for r in records(ckpt) if r["event"] == "save"]
    reports = [r["data"] for r in records(ckpt) if r["event"] == "report"]
    assert sorted(r["checkpoint_path"] for r in reports) == sorted(saves) and len(saves) == 3
    for r in reports:  # one per checkpoint, journaled through the watcher's $ILAB_REPORT
        assert 0.0 <= r["metrics"]["accuracy"] <= 1.0 and r["metrics"]["eval_problems"] > 0
        assert r["delivery_id"] and r["step"] == int(r["checkpoint_path"][-6:])


#: ``ilab-journal`` on a host whose clock is 2 minutes behind the trainer's (as
#: ``faketime -f -2m`` would run it, without depending on faketime being installed).
CLOCK_BEHIND = (
    "import sys, time; t, tn = time.time, time.time_ns; "
    "time.time = lambda: t() - 120; time.time_ns = lambda: tn() - 120 * 10**9; "
    "from journal.cli.main import main; sys.argv[0] = 'ilab-journal'; main()"
)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_stop_from_a_clock_behind_is_applied_and_a_leftover_is_rejected_aloud(
    tmp_path: Path,
) -> None:
    """Staleness is judged on the trainer's side (the file was there before the attempt),
    never by the writer's clock; `--wait` prints the verdict; a rejection is one console line."""
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    leftover = send_command(ckpt, "save", command_id="leftover-save")  # before the attempt
    console = tmp_path / "console.txt"
    with console.open("w") as out:
        job = subprocess.Popen(
            [
                a
                for a in train_argv(ckpt, "--max-steps", "400", "--log-every", "1000")
                if a != "--quiet"
            ],
            env=train_env(step_delay=0.1),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(
                lambda: any(r["event"] == "step_end" and r["step"] >= 2 for r in records(ckpt)),
                what="step 2",
            )
            proc = subprocess.run(
                [sys.executable, "-c", CLOCK_BEHIND, "control", "stop", str(ckpt), "--wait", "120"],
                capture_output=True,
                text=True,
                timeout=180,
                env={**os.environ, "OMP_NUM_THREADS": "1"},
            )
            job.wait(timeout=120)
        finally:
            job.kill()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = proc.stdout.splitlines()
    cid, verdict = line.split(": ", 1)
    applied = control_record(ckpt, cid)
    assert applied is not None and applied["data"]["accepted"] is True
    assert verdict == f"stop applied at step {applied['data']['applied_at_step']}"
    written = json.loads((ckpt / "control" / "processed" / f"{cid}.json").read_text())["ts"]
    begin = next(r for r in records(ckpt) if r["event"] == "train_begin")
    assert written < begin["ts"]  # its own clock said: before the attempt started
    end = records(ckpt)[-1]
    assert job.returncode == 0 and end["event"] == "train_end"
    assert end["data"]["status"] == "stopped" and end["step"] == applied["data"]["applied_at_step"]
    rejected = control_record(ckpt, leftover)
    assert rejected is not None and rejected["data"]["accepted"] is False
    assert rejected["data"]["reason"].startswith("stale")
    said = [ln for ln in console.read_text().splitlines() if leftover in ln]
    assert len(said) == 1 and "rejected" in said[0] and "stale" in said[0], said
