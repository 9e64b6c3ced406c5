"""``ilab-watch --wandb`` in W&B's offline mode: the run directories it writes (what
``wandb sync`` uploads) read back from their transaction logs, with no duplicate row after a
watcher is killed and restarted, or a replay."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from tests.helpers import (
    BIN,
    cli,
    kill_tree,
    records,
    small_tmpfs,
    wait_for,
    write_run,
    write_steps,
)
from watcher.exporters.wandb_log import history_rows, run_files, summary
from watcher.exporters.wandb_log import records as wandb_records

pytest.importorskip("wandb")


def rows(ckpt: Path) -> list[dict[str, Any]]:
    """Every history row of the journal run, over all its run directories."""
    run_id = records(ckpt)[0]["run_id"]
    return [row for f in run_files(ckpt, run_id) for row in history_rows(f)]


def points(ckpt: Path, key: str) -> list[tuple[int, float]]:
    prefix = key.split("/")[0]
    return sorted((r[f"{prefix}/step"], r[key]) for r in rows(ckpt) if key in r)


@pytest.fixture(autouse=True)
def _offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # WANDB_SERVICE: a W&B run in this process (test_exporters_agree exports in-process)
    # leaves its service's address there, and a watcher started from here would share that
    # service, where a killed watcher's run stays open ("run ID ... is in use")
    for name in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_SERVICE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.extended
def test_live_export_survives_a_kill_9_and_a_replay_without_duplicates(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {"lr": 0.001, "model": {"d_model": 8}}})
    write_steps(w, 1, 6)
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--wandb"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: len(points(ckpt, "train/loss")) == 6, 90, "6 loss rows written live")
    finally:
        kill_tree(watcher.pid)  # kill -9: the cursor may lag behind what was written
    write_steps(w, 7, 10)
    w.append("train_end", {"status": "completed"}, step=10)
    w.close()
    proc = cli("ilab-watch", str(ckpt), "--wandb", timeout=120)  # the restart
    assert proc.returncode == 0, proc.stderr
    proc = cli("ilab-watch", str(ckpt), "--wandb", "--replay", "--name", "again", timeout=120)
    assert proc.returncode == 0, proc.stderr

    assert points(ckpt, "train/loss") == [(s, pytest.approx(10.0 / s)) for s in range(1, 11)]
    assert [s for s, _ in points(ckpt, "train/tokens_per_s")] == list(range(1, 11))
    assert points(ckpt, "eval/val_loss") == [(4, pytest.approx(1.25)), (8, pytest.approx(0.625))]
    assert points(ckpt, "report/accuracy") == [(4, pytest.approx(0.04)), (8, pytest.approx(0.08))]
    run_id = records(ckpt)[0]["run_id"]
    dirs = run_files(ckpt, run_id)
    assert all(f.parent.name.startswith("offline-run-") for f in dirs)  # for `wandb sync`
    last = summary(dirs[1])  # the restart's: it saw train_end and the last checkpoint
    assert last["ilab/status"] == "completed"
    # the fold's path: the journal's /c/... read as this run dir's (it was written elsewhere)
    assert last["ilab/last_checkpoint"] == str(ckpt / "checkpoints/step-000008")
    exits = [
        r.exit.exit_code
        for f in dirs[1:2]
        for r in wandb_records(f)
        if r.WhichOneof("record_type") == "exit"
    ]
    assert exits == [0]


@pytest.mark.extended
def test_report_to_wandb_from_ilab_train(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    proc = subprocess.run(
        [
            str(BIN / "ilab-train"),
            *("--demo", "--ckpt-dir", str(ckpt), "--nproc-per-node", "1", "--quiet"),
            *("--max-steps", "4", "--save-every", "2", "--report-to", "wandb"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    logged = [(r["step"], r["data"]["loss"]) for r in records(ckpt) if r["event"] == "log"]
    assert points(ckpt, "train/loss") == [(s, pytest.approx(v)) for s, v in logged]
    assert [s for s, _ in logged] == [1, 2, 3, 4]
    (only,) = run_files(ckpt, records(ckpt)[0]["run_id"])
    assert summary(only)["ilab/status"] == "completed"


def test_a_bad_mode_is_one_line(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
    proc = cli("ilab-watch", str(ckpt), "--replay", "--wandb", env={"WANDB_MODE": "sideways"})
    assert proc.returncode == 2
    assert "WANDB_MODE='sideways'; use offline or online" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.extended  # the W&B area keeps its default runs below
def test_a_wandb_dir_that_cannot_be_written_is_refused_and_replays_add_no_rows(
    tmp_path: Path,
) -> None:
    """wandb itself falls back to /tmp for a dir it cannot write, where the next replay
    does not find the rows and writes them all again: refused before anything is written."""
    ckpt = tmp_path / "run"
    write_run(ckpt, steps=12, save_every=4)
    run_id = records(ckpt)[0]["run_id"]
    with small_tmpfs(tmp_path, "32m") as disk:
        (disk / "wandb").mkdir()  # used before: only writing fails
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        env = {"WANDB_DIR": str(disk)}
        proc = cli("ilab-watch", str(ckpt), "--replay", "--wandb", env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        said = [ln for ln in proc.stderr.splitlines() if str(disk) in ln]
        assert len(said) == 1 and "cannot write" in said[0], proc.stderr
        assert "Traceback" not in proc.stderr and "Falling back" not in proc.stderr
        assert not list(Path(tempfile.gettempdir()).glob(f"wandb/*-{run_id}"))
        assert not list((ckpt / "watch").glob("*.results.jsonl"))  # nothing was delivered

        subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
        for name in ("first", "again"):
            proc = cli(
                "ilab-watch", str(ckpt), "--replay", "--wandb", "--name", name, env=env, timeout=120
            )
            assert proc.returncode == 0, proc.stderr
        logged = [r for f in run_files(disk, run_id) for r in history_rows(f) if "train/loss" in r]
        assert sorted(r["train/step"] for r in logged) == list(range(1, 13))


def test_another_project_is_another_cursor_and_gets_every_row(tmp_path: Path) -> None:
    """``WANDB_PROJECT=p2 ilab-watch --wandb --replay`` after p1: the project is part of the
    cursor's identity and p1's rows are not p2's, so p2 gets every row too (it got none:
    the cursor ignored the project, and the rows of p1's run directories were skipped)."""
    from watcher.exporters.wandb_log import project

    ckpt = tmp_path / "run"
    write_run(ckpt, steps=8, save_every=4)
    run_id = records(ckpt)[0]["run_id"]
    for name in ("p1", "p2"):
        proc = cli(
            "ilab-watch", str(ckpt), "--replay", "--wandb", env={"WANDB_PROJECT": name}, timeout=120
        )
        assert proc.returncode == 0, proc.stderr
    steps: dict[str | None, list[int]] = {}
    for f in run_files(ckpt, run_id):
        logged = [r["train/step"] for r in history_rows(f) if "train/loss" in r]
        steps.setdefault(project(f), []).extend(logged)
    assert {p: sorted(s) for p, s in steps.items()} == {
        "p1": list(range(1, 9)),
        "p2": list(range(1, 9)),
    }


def test_the_last_checkpoint_and_who_stopped_come_from_the_fold(tmp_path: Path) -> None:
    """``ilab/last_checkpoint`` is the newest checkpoint still there (one pruned after its
    save is not), and a hang-aborted attempt says ``ilab/stop_source`` hang, as status."""
    from watcher.alerts.guard import hang_end_payload

    ckpt = tmp_path / "run"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        for step in (2, 4):
            path = ckpt / f"checkpoints/step-{step:06d}"
            path.mkdir(parents=True)
            w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=step)
        (ckpt / "checkpoints/step-000004").rmdir()
        w.append("checkpoint_removed", {"checkpoint_path": str(path), "reason": "pruned"}, step=4)
        marker = {"message": "rank 1 stuck", "alert_id": "a1", "source": "ilab-watch:guard"}
        w.append("train_end", hang_end_payload(marker, written_by="launcher"), step=5)
    proc = cli("ilab-watch", str(ckpt), "--wandb", "--replay", timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run_dir,) = run_files(ckpt, records(ckpt)[0]["run_id"])
    got = summary(run_dir)
    assert got["ilab/last_checkpoint"] == str(ckpt / "checkpoints/step-000002")
    assert got["ilab/stop_source"] == "hang" and got["ilab/stopped_by"] == "ilab-watch:guard"
