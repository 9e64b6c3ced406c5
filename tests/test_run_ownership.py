"""Checkpoints belong to a run: rotation, resume, ``status``, ``query --best``, ``prune`` and
``export`` act only on the checkpoints whose ``full_state/trainer_state.json`` names the run
they act for, and ``ilab-train --resume never`` beside another run's checkpoints is refused.

The unit tests build run dirs by hand (checkpoints are directories with the files that say
whose and whether complete); the end-to-end ones are real 2-rank ``ilab-train`` runs."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from journal.checkpoints.rotation import rotate
from journal.rundir.paths import checkpoints_dir, journal_path
from tests.helpers import cli, make_checkpoint, records, train

RUN_A, RUN_B = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def names(ckpt: Path) -> list[str]:
    return sorted(p.name for p in checkpoints_dir(ckpt).iterdir())


def journal_run(
    ckpt: Path,
    run_id: str,
    saves: list[int],
    *,
    keep_last_n: int = 1,
    reports: dict[int, float] | None = None,
    end: bool = True,
) -> None:
    """Append a run's records (a new run_id) to the journal: train_begin with its rotation
    policy, a save per step in ``saves``, reports of accuracy, train_end."""
    with JournalWriter(ckpt, run_id=run_id) as w:
        config = {"keep_last_n": keep_last_n, "keep_best": "accuracy:max"}
        w.append("train_begin", {"config": config, "total_steps": 60})
        for step in saves:
            path = str(checkpoints_dir(ckpt) / f"step-{step:06d}")
            w.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=step)
            if reports and step in reports:
                report = {"id": f"r{step}", "checkpoint_path": path, "step": step}
                w.append("report", {**report, "metrics": {"accuracy": reports[step]}}, step=step)
        if end:
            w.append("train_end", {"status": "completed", "reason": None}, step=max(saves or [0]))


@pytest.fixture
def two_runs(ckpt: Path) -> Path:
    """The dir of issue 33: run A saved 40/50/60, then run B (the journal's last run) saved
    10 and 20 in the same dir."""
    for step in (40, 50, 60):
        make_checkpoint(ckpt, step, RUN_A)
    journal_run(ckpt, RUN_A, [40, 50, 60], reports={60: 0.9})
    for step in (10, 20):
        make_checkpoint(ckpt, step, RUN_B)
    journal_run(ckpt, RUN_B, [10, 20], reports={20: 0.5})
    return ckpt


# -- rotation, prune, status, query, export: fast, no torch ---------------------------------


def test_rotation_removes_only_the_checkpoints_of_its_own_run(two_runs: Path) -> None:
    removed: list[dict[str, Any]] = []
    rotate(two_runs, 1, keep=set(), emit=lambda ev, data: removed.append(data), run_id=RUN_B)
    assert names(two_runs) == ["step-000020", "step-000040", "step-000050", "step-000060"]
    assert [Path(r["checkpoint_path"]).name for r in removed] == ["step-000010"]


def test_prune_applies_the_journal_runs_policy_to_its_checkpoints_only(two_runs: Path) -> None:
    proc = cli("ilab-journal", "prune", str(two_runs))
    assert proc.returncode == 0, proc.stderr
    assert [Path(p).name for p in proc.stdout.split()] == ["step-000010"]
    assert names(two_runs) == ["step-000020", "step-000040", "step-000050", "step-000060"]


def test_status_of_a_new_run_names_no_checkpoint_of_the_run_before(ckpt: Path) -> None:
    make_checkpoint(ckpt, 60, RUN_A)
    journal_run(ckpt, RUN_A, [60])
    journal_run(ckpt, RUN_B, [], end=False)  # B has begun, saved nothing yet
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["run_id"] == RUN_B and status["last_checkpoint"] is None


def test_query_best_names_the_best_of_the_journal_run(two_runs: Path) -> None:
    proc = cli("ilab-journal", "query", str(two_runs), "--best", "accuracy:max")
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip()).name == "step-000020"  # B's 0.5, not A's 0.9


def test_export_picks_and_accepts_only_checkpoints_of_the_journal_run(two_runs: Path) -> None:
    from trainer.checkpoint.export import ExportError, find_checkpoint

    assert find_checkpoint(two_runs, None).name == "step-000020"
    assert find_checkpoint(two_runs, 10).name == "step-000010"
    with pytest.raises(ExportError, match=f"run {RUN_A}"):
        find_checkpoint(two_runs, 60)


# -- resume: the run's own newest complete checkpoint (RunJournal in this process) -------------


def open_journal(ckpt: Path) -> tuple[Path | None, str | None]:
    """Open the run journal as a relaunch's rank 0 does; (resume checkpoint, run id)."""
    from trainer.journaling.run_journal import RunJournal

    j = RunJournal(ckpt, main=True, role="test")
    try:
        found = j.open(resume="auto")
        return found, j.run_id
    finally:
        j.close()


def test_resume_auto_continues_the_journal_run_from_its_own_checkpoint(ckpt: Path) -> None:
    """The variant of issue 33: run 1 to step 30, run 2 to step 20; a relaunch said
    'resumed from step-000030' (run 1's) and journaled it as attempt 2 of run 2."""
    make_checkpoint(ckpt, 30, RUN_A)
    journal_run(ckpt, RUN_A, [30])
    for step in (10, 20):
        make_checkpoint(ckpt, step, RUN_B)
    journal_run(ckpt, RUN_B, [10, 20])
    found, run_id = open_journal(ckpt)
    assert found is not None and found.name == "step-000020" and run_id == RUN_B


def test_without_a_journal_resume_continues_the_run_of_the_newest_checkpoint(
    ckpt: Path,
) -> None:
    make_checkpoint(ckpt, 10, RUN_A)
    found, run_id = open_journal(ckpt)
    assert found is not None and found.name == "step-000010" and run_id == RUN_A
    assert {r["run_id"] for r in records(ckpt)} <= {RUN_A}


def test_a_newest_checkpoint_without_metadata_is_skipped_with_one_line(
    ckpt: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A crash in a synchronous save or a copy cut short: every relaunch failed in DCP with
    'CheckpointException ranks:dict_keys([0, 1])'."""
    make_checkpoint(ckpt, 10, RUN_B)
    make_checkpoint(ckpt, 20, RUN_B, complete=False)
    journal_run(ckpt, RUN_B, [10, 20], end=False)
    with caplog.at_level(logging.WARNING):
        found, _ = open_journal(ckpt)
    assert found is not None and found.name == "step-000010"
    said = [r.getMessage() for r in caplog.records if "step-000020" in r.getMessage()]
    assert len(said) == 1 and "incomplete" in said[0], caplog.text
    assert (checkpoints_dir(ckpt) / "step-000020").is_dir()  # left for the user to look at


def test_a_save_over_another_runs_checkpoint_moves_it_aside(ckpt: Path) -> None:
    from trainer.checkpoint.sharded import put_in_place

    old = make_checkpoint(ckpt, 30, RUN_A)
    tmp = checkpoints_dir(ckpt) / ".tmp-step-000030"
    shutil.copytree(old, tmp)
    (tmp / "full_state" / "trainer_state.json").write_text(json.dumps({"run_id": RUN_B}))
    put_in_place(tmp, old, RUN_B)
    aside = checkpoints_dir(ckpt) / f"step-000030.run-{RUN_A}"
    assert json.loads((aside / "full_state" / "trainer_state.json").read_text())["run_id"] == RUN_A
    assert json.loads((old / "full_state" / "trainer_state.json").read_text())["run_id"] == RUN_B
    assert names(ckpt) == ["step-000030", f"step-000030.run-{RUN_A}"]


# -- real 2-rank runs -----------------------------------------------------------------------


@pytest.mark.dist
@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_resume_never_beside_another_runs_checkpoints_is_refused(tmp_path: Path) -> None:
    """Issue 33, high 1: the second run's rotation deleted its own checkpoints and kept the
    first run's. Now it is refused in one line before any worker starts, nothing removed;
    --resume auto continues the first run."""
    ckpt = tmp_path / "run"
    first = train(ckpt, "--max-steps", "6", "--save-every", "2", "--keep-last-n", "2")
    assert first.returncode == 0, first.stderr[-3000:]
    kept, journal = names(ckpt), journal_path(ckpt).read_bytes()
    assert kept == ["step-000004", "step-000006"]

    refused = train(ckpt, "--max-steps", "4", "--save-every", "2", "--resume", "never")
    assert refused.returncode == 2, refused.stderr[-3000:]
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "--ckpt-dir" in line and "--resume auto" in line
    assert names(ckpt) == kept and journal_path(ckpt).read_bytes() == journal

    again = train(ckpt, "--max-steps", "8", "--save-every", "2", "--keep-last-n", "2")
    assert again.returncode == 0, again.stderr[-3000:]
    begins = [r for r in records(ckpt) if r["event"] == "train_begin"]
    run = begins[0]["run_id"]
    assert [(b["run_id"], b["attempt"]) for b in begins] == [(run, 1), (run, 2)]
    assert begins[1]["data"]["resumed_from"].endswith("step-000006")
    assert names(ckpt) == ["step-000006", "step-000008"]


@pytest.mark.dist
@pytest.mark.extended
def test_a_run_beside_newer_checkpoints_of_another_run_keeps_to_its_own(tmp_path: Path) -> None:
    """The other order: run B's dir (its journal, its checkpoints 2 and 4) also holds run
    A's newer checkpoints 6 and 8 (copied in, or left there before --resume never was
    refused). --resume auto continues B from B's step 4, not A's 8; B's saves of steps 6
    and 8 move A's aside under a name that says whose, and B's rotation leaves them."""
    a, b = tmp_path / "a", tmp_path / "b"
    args = ("--save-every", "2", "--keep-last-n", "2")
    assert train(a, "--max-steps", "8", *args).returncode == 0
    assert train(b, "--max-steps", "4", *args).returncode == 0
    run_a = records(a)[0]["run_id"]
    for name in ("step-000006", "step-000008"):
        shutil.copytree(checkpoints_dir(a) / name, checkpoints_dir(b) / name)

    proc = train(b, "--max-steps", "10", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    begins = [r for r in records(b) if r["event"] == "train_begin"]
    assert begins[1]["run_id"] == begins[0]["run_id"] and begins[1]["attempt"] == 2
    assert begins[1]["data"]["resumed_from"].endswith("step-000004")
    aside = [f"step-000006.run-{run_a}", f"step-000008.run-{run_a}"]
    assert names(b) == sorted(["step-000008", "step-000010", *aside])
    status = json.loads(cli("ilab-journal", "status", str(b), "--json").stdout)
    assert Path(status["last_checkpoint"]).is_dir()


@pytest.mark.dist
@pytest.mark.extended
def test_relaunch_after_a_newest_checkpoint_lost_its_metadata(tmp_path: Path) -> None:
    """Every relaunch used to fail with 'CheckpointException ranks:dict_keys([0, 1])'."""
    ckpt = tmp_path / "run"
    args = ("--save-every", "2", "--keep-last-n", "3")
    assert train(ckpt, "--max-steps", "6", *args).returncode == 0
    (checkpoints_dir(ckpt) / "step-000006" / "full_state" / ".metadata").unlink()
    proc = train(ckpt, "--max-steps", "8", *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    begins = [r for r in records(ckpt) if r["event"] == "train_begin"]
    assert begins[1]["data"]["resumed_from"].endswith("step-000004")
    log = (ckpt / "logs" / "rank-0.log").read_text()
    assert sum("step-000006" in line and "incomplete" in line for line in log.splitlines()) == 1
