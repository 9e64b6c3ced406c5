"""The one run journal that ``ilab-train`` and the bridges write through: the resume rule,
the ``versions`` payload, control ids handled before, the best checkpoint it owns, and the
position every record carries. Real journals and run dirs, in this process (one rank)."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

import pytest
import torch

from journal import JournalWriter, send_command
from journal.channels.reports import Report, submit_report
from journal.rundir.paths import checkpoints_dir, journal_path
from journal.rundir.safety import make_dir
from journal.store import continues_run
from tests.helpers import records, write_run
from trainer.checkpoint.sharded import TrainerState
from trainer.journaling.emitter import Where
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import STOP


def attempt(ckpt: Path, resume: Any, **kw: Any) -> tuple[Path | None, dict[str, Any]]:
    """Open a run journal as a new attempt would, write its train_begin; returns the
    checkpoint it resumes from and that train_begin record."""
    j = RunJournal(ckpt, main=True, role="test", **kw)
    try:
        found = j.open(resume=resume)
        j.begin({"lr": 1e-4}, total_steps=10, device_type="cpu")
    finally:
        j.close()
    return found, [r for r in records(ckpt) if r["event"] == "train_begin"][-1]


def add_checkpoint(ckpt: Path, step: int, run_id: str | None = None) -> Path:
    """A checkpoint dir; with ``run_id`` a complete one of that run (``full_state/`` with the
    ``trainer_state.json`` naming it and DCP's ``.metadata``), as resume and rotation want."""
    path = checkpoints_dir(ckpt) / f"step-{step:06d}"
    make_dir(path.parent)
    path.mkdir()
    if run_id is not None:
        (path / "full_state").mkdir()
        (path / "full_state" / "trainer_state.json").write_text(json.dumps({"run_id": run_id}))
        (path / "full_state" / ".metadata").write_bytes(b"")
    return path


def test_the_resume_rule() -> None:
    assert not continues_run(None, resumes=True)  # no journal: a new run
    assert continues_run({"event": "step_end"}, resumes=False)  # killed: go on
    assert not continues_run({"event": "train_end"}, resumes=False)
    assert continues_run({"event": "train_end"}, resumes=True)


def test_a_report_after_train_end_does_not_make_a_relaunch_continue_the_run(ckpt: Path) -> None:
    first = write_run(ckpt, steps=4, save_every=0)  # ended, no checkpoint
    with JournalWriter(ckpt, join=True) as w:  # a late eval's report, after train_end
        w.append_at_last_position(
            "report", {"checkpoint_path": str(ckpt / "x"), "metrics": {"a": 1}}
        )
    _, begin = attempt(ckpt, "auto")
    assert begin["run_id"] != first.run_id and begin["attempt"] == 1


def test_a_launchers_relaunch_continues_the_failed_run_without_a_checkpoint(ckpt: Path) -> None:
    """--max-restarts: an attempt failed (a hang aborted) before its first save; the
    launcher's relaunch is that run's next attempt, so its alerts and history stay one run."""
    first = write_run(ckpt, steps=4, save_every=0, end="failed")
    j = RunJournal(ckpt, main=True, role="test")
    try:
        assert j.open(resume="auto", relaunch=True) is None  # from the start: no checkpoint
        assert (j.run_id, j.attempt) == (first.run_id, 2)
    finally:
        j.close()


@pytest.mark.parametrize("resume", ["auto", True, False])
def test_an_attempt_after_a_kill_continues_the_run(ckpt: Path, resume: Any) -> None:
    first = write_run(ckpt, steps=4, save_every=0, end=None)
    found, begin = attempt(ckpt, resume)
    assert found is None
    assert (begin["run_id"], begin["attempt"]) == (first.run_id, 2)


def test_a_finished_run_continues_only_when_resumed_from_a_checkpoint(ckpt: Path) -> None:
    first = write_run(ckpt, steps=4, save_every=0)
    _, begin = attempt(ckpt, "auto")  # no checkpoint to resume from: a new run
    assert begin["run_id"] != first.run_id and begin["attempt"] == 1
    second = begin["run_id"]
    path = add_checkpoint(ckpt, 4, second)
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="auto")
    j.end({"status": "completed", "reason": None, "final_checkpoint": None})
    j.close()
    found, begin = attempt(ckpt, "auto")  # ilab-train found checkpoints/step-000004
    assert found == path and (begin["run_id"], begin["attempt"]) == (second, 3)
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume=True)
    j.end({"status": "completed", "reason": None, "final_checkpoint": None})
    j.close()
    _, begin = attempt(ckpt, True)  # a bridge: HF resumed from its checkpoint-N
    assert (begin["run_id"], begin["attempt"]) == (second, 5)


def test_resume_never_starts_a_new_run_beside_a_killed_one(ckpt: Path) -> None:
    first = write_run(ckpt, steps=4, save_every=0, end=None)
    add_checkpoint(ckpt, 4)
    found, begin = attempt(ckpt, "never")
    assert found is None and begin["run_id"] != first.run_id and begin["attempt"] == 1


def test_train_begin_names_the_versions_and_the_run(ckpt: Path) -> None:
    _, begin = attempt(ckpt, "auto")
    data = begin["data"]
    versions = data["versions"]
    assert versions["python"] == platform.python_version()
    assert versions["torch"] == torch.__version__
    assert {"ilab-journal", "transformers", "accelerate"} <= set(versions)
    assert all(isinstance(v, str) and v for v in versions.values())
    assert data["world_size"] == 1 and data["nnodes"] == 1 and data["journal_detail"] == "step"
    assert data["config"] == {"lr": 1e-4} and data["total_steps"] == 10
    assert journal_path(ckpt).is_file()


def test_records_carry_the_position_of_the_state_they_follow(ckpt: Path) -> None:
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="auto")
    j.emit("epoch_begin", {})  # nothing followed yet: the start
    state = TrainerState(step=7, epoch=1, samples_seen=448)
    j.follow(state)
    j.emit("step_begin")
    state.step, state.samples_seen = 8, 512
    j.emit("step_end", {})
    where = Where(step=3)
    j.follow(where)  # e.g. the Accelerate tracker's last told step
    j.emit("log", {"loss": 1.0})
    j.end({"status": "completed", "reason": None, "final_checkpoint": None})
    j.close()
    got = [(r["event"], r["step"], r["epoch"], r["samples_seen"]) for r in records(ckpt)]
    assert got == [
        ("epoch_begin", 0, 0, 0),
        ("step_begin", 7, 1, 448),
        ("step_end", 8, 1, 512),
        ("log", 3, 0, 0),
        ("train_end", 3, 0, 0),
    ]


def test_commands_handled_in_an_earlier_attempt_are_not_applied_again(ckpt: Path) -> None:
    write_run(ckpt, steps=2, save_every=0, end=None)
    with JournalWriter(ckpt, resume=True) as again:
        old = {"command": "stop", "id": "old", "source": None, "accepted": True}
        again.append("control", {**old, "reason": None, "applied_at_step": 2}, step=2)
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="auto")
    try:
        send_command(ckpt, "stop", command_id="old")  # e.g. left behind by a crash
        assert j.inbox.poll_control() == 0
        send_command(ckpt, "stop", command_id="new")
        j.inbox.poller.watch.changed = True  # type: ignore[union-attr]  # no wait for the thread
        assert j.inbox.poll_control() == STOP
        applied = j.inbox.journal_control()
    finally:
        j.close()
    assert [c["id"] for c in applied] == ["new"]


def test_the_best_checkpoint_is_the_journals_own(ckpt: Path) -> None:
    """keep_best: the best is folded from the earlier attempt's records of the run and from
    what this attempt journals; train_end names it."""
    write_run(ckpt, steps=4, save_every=0, end=None)
    with JournalWriter(ckpt, resume=True) as again:
        again.append("evaluate", {"val_loss": 0.5}, step=2)
        path2 = str(add_checkpoint(ckpt, 2))
        again.append("save", {"checkpoint_path": path2, "kind": ["hf"], "duration": 0}, step=2)
    j = RunJournal(ckpt, main=True, role="test", keep_best="val_loss:min")
    j.open(resume="auto")
    best = j.best_checkpoint()
    assert best is not None and best.checkpoint_path == path2
    state = TrainerState(step=6)
    j.follow(state)
    j.emit("evaluate", {"val_loss": 0.25})
    path6 = str(add_checkpoint(ckpt, 6))
    j.emit("save", {"checkpoint_path": path6, "kind": ["hf"], "duration": 0})
    j.end({"status": "completed", "reason": None, "final_checkpoint": path6}, step_time_s=1.0)
    j.close()
    end = records(ckpt)[-1]["data"]
    assert end["best_checkpoint"]["checkpoint_path"] == path6
    assert end["best_checkpoint"]["value"] == 0.25
    assert end["journal"]["records"] == 2 and end["journal"]["step_time_s_total"] == 1.0


def test_keep_best_answers_when_the_index_cannot_be_written(ckpt: Path) -> None:
    """The index is a cache: with ``journal.index.json`` unwritable (a directory there),
    training goes on and the writer's live fold still answers keep_best and train_end."""
    (ckpt / "journal.index.json").mkdir()
    j = RunJournal(ckpt, main=True, role="test", keep_best="val_loss:min")
    j.open(resume="never")
    j.begin({"lr": 1e-4}, total_steps=4, device_type="cpu")
    j.follow(state := TrainerState(step=2))
    paths = {}
    for step, loss in ((2, 0.5), (4, 0.75)):
        state.step = step
        j.emit("evaluate", {"val_loss": loss})
        paths[step] = str(add_checkpoint(ckpt, step))
        j.emit("save", {"checkpoint_path": paths[step], "kind": ["hf"], "duration": 0})
    best = j.best_checkpoint()
    j.end({"status": "completed", "reason": None, "final_checkpoint": paths[4]})
    j.close()
    assert best is not None and best.checkpoint_path == paths[2]
    assert records(ckpt)[-1]["data"]["best_checkpoint"]["checkpoint_path"] == paths[2]
    assert (ckpt / "journal.index.json").is_dir()


def test_keep_best_remembers_the_best_across_a_cut_of_the_journal(ckpt: Path) -> None:
    """logrotate's copytruncate cuts the journal under the trainer: the writer's live fold
    starts again from the new file, yet the best saved before the cut is still kept by
    rotation (``--keep-last-n 1 --keep-best val_loss:min``) and named by train_end."""
    j = RunJournal(ckpt, main=True, role="test", keep_best="val_loss:min")
    j.open(resume="never")
    j.begin({"lr": 1e-4}, total_steps=8, device_type="cpu")
    j.follow(state := TrainerState(step=2))
    paths = {}
    for step, loss in ((2, 0.25), (4, 0.5), (6, 0.75), (8, 0.9)):
        state.step = step
        j.emit("evaluate", {"val_loss": loss})
        paths[step] = str(add_checkpoint(ckpt, step, j.run_id))
        j.emit("save", {"checkpoint_path": paths[step], "kind": ["full_state"], "duration": 0})
        j.rotate(1)
        if step == 4:
            os.truncate(ckpt / "journal.jsonl", 0)
    best = j.best_checkpoint()
    j.end({"status": "completed", "reason": None, "final_checkpoint": paths[8]})
    j.close()
    assert best is not None and best.checkpoint_path == paths[2]
    assert sorted(p.name for p in (ckpt / "checkpoints").iterdir()) == [
        "step-000002",
        "step-000008",
    ]
    assert records(ckpt)[-1]["data"]["best_checkpoint"]["checkpoint_path"] == paths[2]


def test_train_end_is_written_once(ckpt: Path) -> None:
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="auto")
    j.end({"status": "completed", "reason": None, "final_checkpoint": None})
    j.fail(RuntimeError("after the end"))  # e.g. an error while shutting down
    j.end({"status": "stopped", "reason": None, "final_checkpoint": None})
    j.close()
    j.close()
    ends = [r for r in records(ckpt) if r["event"] == "train_end"]
    assert [e["data"]["status"] for e in ends] == ["completed"]


def test_a_failure_ends_the_run_failed_with_its_error(ckpt: Path) -> None:
    j = RunJournal(ckpt, main=True, role="test")
    j.open(resume="auto")
    try:
        raise ValueError("boom")
    except ValueError as exc:
        j.fail(exc)
    j.close()
    end = records(ckpt)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert end["data"]["reason"] == "ValueError: boom" and "journal" in end["data"]


def test_other_ranks_write_nothing_and_take_no_lock(ckpt: Path) -> None:
    j = RunJournal(ckpt, main=False, role="test")
    assert j.open(resume="auto") is None
    j.emit("step_begin")
    j.end({"status": "completed", "reason": None, "final_checkpoint": None})
    assert j.inbox.poll_control() == 0 and j.lock is None
    j.close()
    assert not journal_path(ckpt).exists()


def test_a_bridge_journals_reports_and_commands_at_its_step_boundary(ckpt: Path) -> None:
    """What HF's on_step_end and Accelerate's poll_control call: one agreement (one rank
    here), then the commands and the reports that came in, at the step the loop is at."""
    j = RunJournal(ckpt, main=True, role="hf-trainer")
    j.open(resume=False)
    j.follow(Where(step=3))
    hf_checkpoint = ckpt / "checkpoint-3"
    hf_checkpoint.mkdir()
    (hf_checkpoint / "config.json").write_text("{}")  # what HF wrote before on_save
    submit_report(ckpt, Report({"accuracy": 0.5}, checkpoint_path=hf_checkpoint))
    send_command(ckpt, "stop")
    try:
        bits, applied, interrupted = j.inbox.agree(torch.device("cpu"), signalled=False)
    finally:
        j.close()
    assert bits == STOP and [c["command"] for c in applied] == ["stop"] and not interrupted
    got = {r["event"]: r for r in records(ckpt)}
    assert got["report"]["data"]["metrics"] == {"accuracy": 0.5}
    assert got["report"]["step"] == got["control"]["step"] == 3


def test_a_report_file_for_a_missing_checkpoint_never_makes_the_trainer_keep_it(
    ckpt: Path,
) -> None:
    """keep_last_n=1, keep_best accuracy:max: a report file dropped into reports/ by hand
    for a checkpoint that was never saved (step 999) is refused when the trainer journals
    it (a control record with the reason), so the real best (step 10) survives rotation
    and train_end names it."""
    j = RunJournal(ckpt, main=True, role="test", keep_best="accuracy:max")
    j.open(resume="never")
    j.follow(state := TrainerState(step=10))
    path10 = add_checkpoint(ckpt, 10)
    (path10 / "trainer_state.json").write_text("{}")
    j.emit("save", {"checkpoint_path": str(path10), "kind": ["full_state"], "duration": 0})
    submit_report(ckpt, Report(accuracy=0.9, checkpoint_path=path10))
    planted = {
        "id": "planted",
        "checkpoint_path": str(checkpoints_dir(ckpt) / "step-000999"),
        "step": 999,
        "metrics": {"accuracy": 0.95},
        "reported_at": 1.0,
    }
    (ckpt / "reports" / "planted.json").write_text(json.dumps(planted))
    state.step = 20
    path20 = add_checkpoint(ckpt, 20)
    (path20 / "trainer_state.json").write_text("{}")
    j.emit("save", {"checkpoint_path": str(path20), "kind": ["full_state"], "duration": 0})
    j.rotate(1)
    j.end({"status": "completed", "reason": None, "final_checkpoint": str(path20)})
    j.close()
    assert path10.is_dir() and path20.is_dir()
    recs = records(ckpt)
    assert [r["data"]["checkpoint_path"] for r in recs if r["event"] == "report"] == [str(path10)]
    (refused,) = [r["data"] for r in recs if r["event"] == "control"]
    assert refused["accepted"] is False and "no such checkpoint" in refused["reason"]
    assert recs[-1]["data"]["best_checkpoint"]["checkpoint_path"] == str(path10)
