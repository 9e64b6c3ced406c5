"""A report belongs to a checkpoint of its own run: a path elsewhere is refused when it is
submitted (one line, exit 2) and when a planted file is ingested, and a report for a
checkpoint rotation removed never makes it the best. Real CLI subprocesses, real files."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, Report, read_all, submit_report
from journal.channels.reports import InvalidReport, ingest, pending
from tests.helpers import cli


def ckpt_path(ckpt: Path, step: int) -> str:
    return str(ckpt / "checkpoints" / f"step-{step:06d}")


def records(ckpt: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in read_all(ckpt / "journal.jsonl").records if r["event"] == event]


def make_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory with its files (a stand-in for what a save writes)."""
    d = Path(path)
    (d / "full_state").mkdir(parents=True)
    (d / "full_state" / "trainer_state.json").write_text("{}")
    return d


def run_with_checkpoints(ckpt: Path, *steps: int) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max", "keep_last_n": 1}})
        for step in steps:
            make_checkpoint(ckpt_path(ckpt, step))
            w.append("save", {"checkpoint_path": ckpt_path(ckpt, step)}, step=step)
        w.append("train_end", {"status": "completed"}, step=steps[-1])


@pytest.mark.parametrize(
    "where",
    [
        "../../etc",
        "/etc",
        "/elsewhere/checkpoints/step-000004",
        "{ckpt}/step-000004",  # a checkpoint name, but not where this run keeps them
        "{ckpt}/checkpoints/../../other/checkpoints/step-000004",
    ],
)
def test_a_report_for_a_path_outside_the_run_is_refused_in_one_line(ckpt: Path, where: str) -> None:
    run_with_checkpoints(ckpt, 4)
    before = (ckpt / "journal.jsonl").read_bytes()
    proc = cli(
        "ilab-journal", "report", str(ckpt), "accuracy=7", "--checkpoint", where.format(ckpt=ckpt)
    )
    assert proc.returncode == 2, proc.stderr
    assert "not a checkpoint of" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert (ckpt / "journal.jsonl").read_bytes() == before and pending(ckpt) == []
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.returncode == 1 and best.stdout == ""


def test_a_checkpoint_given_by_name_or_relative_path_is_recorded_by_its_full_path(
    ckpt: Path,
) -> None:
    run_with_checkpoints(ckpt, 2, 4)
    by_name = cli("ilab-journal", "report", str(ckpt), "acc=1", "--checkpoint", "step-000002")
    assert by_name.returncode == 0, by_name.stderr
    rel = cli(
        "ilab-journal",
        "report",
        ".",
        "acc=2",
        "--checkpoint",
        "checkpoints/step-000004",
        cwd=ckpt,
    )
    assert rel.returncode == 0, rel.stderr
    got = [(r["data"]["checkpoint_path"], r["data"]["step"]) for r in records(ckpt, "report")]
    assert got == [(ckpt_path(ckpt, 2), 2), (ckpt_path(ckpt, 4), 4)]


def test_the_python_api_refuses_a_checkpoint_of_another_run(ckpt: Path, tmp_path: Path) -> None:
    run_with_checkpoints(ckpt, 2)
    other = make_checkpoint(tmp_path / "other" / "checkpoints" / "step-000002")
    with pytest.raises(InvalidReport, match="not a checkpoint of"):
        submit_report(ckpt, Report(accuracy=1.0, checkpoint_path=other))
    assert pending(ckpt) == []


@pytest.mark.parametrize("own", ["alerts", "logs", "watch", "control"])
def test_the_run_dirs_own_directories_are_never_a_checkpoint(ckpt: Path, own: str) -> None:
    """A report naming ``RUN/alerts`` (or another of the run dir's own directories) is
    refused: the guard's alert ledger was taken for a checkpoint."""
    run_with_checkpoints(ckpt, 2)
    (ckpt / own).mkdir(exist_ok=True)
    with pytest.raises(InvalidReport, match="not a checkpoint of"):
        submit_report(ckpt, Report(accuracy=1.0, checkpoint_path=ckpt / own))
    assert pending(ckpt) == []


def test_a_planted_report_naming_a_path_elsewhere_is_refused_at_ingest(ckpt: Path) -> None:
    """A report file written by hand (not through `report`) gets the same rule."""
    run_with_checkpoints(ckpt, 4)
    inbox = ckpt / "reports"
    inbox.mkdir()
    body = {
        "id": "x",
        "checkpoint_path": "/etc",
        "step": 1,
        "metrics": {"accuracy": 7},
        "reported_at": time.time(),
    }
    (inbox / "x.json").write_text(json.dumps(body))
    with JournalWriter(ckpt, join=True) as w:
        ingest(ckpt, w.append_at_last_position)
    assert records(ckpt, "report") == []
    refused = [r["data"] for r in records(ckpt, "control") if r["data"]["command"] is None]
    assert len(refused) == 1 and "not a checkpoint of" in refused[0]["reason"]
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.returncode == 1 and "/etc" not in best.stdout


def test_a_report_for_a_rotated_checkpoint_never_becomes_the_best(ckpt: Path) -> None:
    """Step 2 was journaled as removed; a report for it afterwards (its path is still this
    run's) is journaled but is not the best: query --best, status and rotation's keep agree."""
    run_with_checkpoints(ckpt, 2, 4)
    with JournalWriter(ckpt, join=True) as w:
        w.append_at_last_position(
            "report",
            {"checkpoint_path": ckpt_path(ckpt, 4), "step": 4, "metrics": {"accuracy": 0.5}},
        )
        w.append_at_last_position(
            "checkpoint_removed", {"checkpoint_path": ckpt_path(ckpt, 2), "reason": "rotation"}
        )
        w.append_at_last_position(
            "report",
            {"checkpoint_path": ckpt_path(ckpt, 2), "step": 2, "metrics": {"accuracy": 0.99}},
        )
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.returncode == 0 and best.stdout.strip() == ckpt_path(ckpt, 4)
    for full in ([], ["--full"]):
        status = cli("ilab-journal", "status", str(ckpt), "--json", *full)
        got = json.loads(status.stdout)["best_checkpoint"]
        assert got["checkpoint_path"] == ckpt_path(ckpt, 4) and got["value"] == 0.5


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("step-000999", "no such checkpoint"),  # the case: never saved
        ("{ckpt}/checkpoints/step-000999", "no such checkpoint"),
        ("step-000006", "an empty directory"),  # made by hand: no checkpoint's files
        ("step-000008", "not a checkpoint directory"),  # a file of that name
    ],
)
def test_a_report_for_a_checkpoint_that_does_not_exist_is_refused_in_one_line(
    ckpt: Path, where: str, why: str
) -> None:
    """`report --checkpoint step-000999` for a run that saved step 4 used to exit 0; its
    report then became the best and rotation deleted the real best."""
    run_with_checkpoints(ckpt, 4)
    (ckpt / "checkpoints" / "step-000006").mkdir()
    (ckpt / "checkpoints" / "step-000008").write_text("not a checkpoint")
    before = (ckpt / "journal.jsonl").read_bytes()
    proc = cli(
        "ilab-journal",
        "report",
        str(ckpt),
        "accuracy=0.95",
        "--checkpoint",
        where.format(ckpt=ckpt),
    )
    assert proc.returncode == 2, proc.stderr
    assert why in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert (ckpt / "journal.jsonl").read_bytes() == before and pending(ckpt) == []
    ok = cli("ilab-journal", "report", str(ckpt), "accuracy=0.9", "--checkpoint", "step-000004")
    assert ok.returncode == 0, ok.stderr
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.stdout.strip() == ckpt_path(ckpt, 4)


def test_a_planted_report_for_a_checkpoint_removed_since_is_refused_at_ingest(ckpt: Path) -> None:
    """A report file that names a checkpoint gone by the time it is journaled (removed by
    hand, or never saved) is refused with its reason, like any invalid report file."""
    run_with_checkpoints(ckpt, 2, 4)
    inbox = ckpt / "reports"
    inbox.mkdir()
    for rid, step in (("gone", 2), ("never", 999)):
        body = {
            "id": rid,
            "checkpoint_path": ckpt_path(ckpt, step),
            "step": step,
            "metrics": {"accuracy": 0.99},
            "reported_at": time.time(),
        }
        (inbox / f"{rid}.json").write_text(json.dumps(body))
    shutil.rmtree(ckpt_path(ckpt, 2))
    with JournalWriter(ckpt, join=True) as w:
        ingest(ckpt, w.append_at_last_position)
    assert records(ckpt, "report") == []
    refused = [r["data"] for r in records(ckpt, "control") if r["data"]["command"] is None]
    assert len(refused) == 2 and all("no such checkpoint" in r["reason"] for r in refused)
    assert sorted(p.name for p in (inbox / "rejected").iterdir()) == ["gone.json", "never.json"]
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.returncode == 1 and best.stdout == ""


def test_the_best_checkpoint_is_never_one_that_is_gone_from_disk(ckpt: Path) -> None:
    """The journal's best (step 2) was deleted by hand: query --best, status and prune name
    and keep the best checkpoint still on disk (step 4), never a path that does not exist."""
    run_with_checkpoints(ckpt, 2, 4, 6)
    for step, acc in ((2, 0.9), (4, 0.7), (6, 0.5)):
        proc = cli(
            "ilab-journal",
            "report",
            str(ckpt),
            f"accuracy={acc}",
            "--checkpoint",
            ckpt_path(ckpt, step),
        )
        assert proc.returncode == 0, proc.stderr
    shutil.rmtree(ckpt_path(ckpt, 2))
    best = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert best.returncode == 0 and best.stdout.strip() == ckpt_path(ckpt, 4)
    for full in ([], ["--full"]):
        status = cli("ilab-journal", "status", str(ckpt), "--json", *full)
        assert json.loads(status.stdout)["best_checkpoint"]["checkpoint_path"] == ckpt_path(ckpt, 4)
    pruned = cli("ilab-journal", "prune", str(ckpt))  # keep_last_n=1: step 6, and the best
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(p.name for p in (ckpt / "checkpoints").iterdir()) == [
        "step-000004",
        "step-000006",
    ]
