"""A report belongs to a checkpoint of its own run: a path elsewhere is refused when it is
submitted (one line, exit 2) and when a planted file is ingested, and a report for a
checkpoint rotation removed never makes it the best. Real CLI subprocesses, real files."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, Report, read_all, submit_report
from journal.reports import InvalidReport, ingest, pending
from tests.helpers import cli


def ckpt_path(ckpt: Path, step: int) -> str:
    return str(ckpt / "checkpoints" / f"step-{step:06d}")


def records(ckpt: Path, event: str) -> list[dict[str, Any]]:
    return [r for r in read_all(ckpt / "journal.jsonl").records if r["event"] == event]


def run_with_checkpoints(ckpt: Path, *steps: int) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max", "keep_last_n": 1}})
        for step in steps:
            Path(ckpt_path(ckpt, step)).mkdir(parents=True)
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
    other = tmp_path / "other" / "checkpoints" / "step-000002"
    other.mkdir(parents=True)
    with pytest.raises(InvalidReport, match="not a checkpoint of"):
        submit_report(ckpt, Report(accuracy=1.0, checkpoint_path=other))
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
