"""Results flowing back, without a trainer: reports, leases, the best checkpoint, skipped
deliveries. Real CLI subprocesses and a real watcher on journals written by the writer."""

from __future__ import annotations

import json
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, read_all
from journal.channels.reports import pending
from journal.checkpoints import leases
from journal.rundir.lock import JournalLock
from tests.helpers import cli, write_run


def ckpt_path(ckpt: Path, step: int) -> str:
    return str(ckpt / "checkpoints" / f"step-{step:06d}")


def on_disk(ckpt: Path, *steps: int) -> None:
    """Checkpoint directories with their files: a report must name one that exists."""
    for step in steps:
        Path(ckpt_path(ckpt, step), "full_state").mkdir(parents=True)
        Path(ckpt_path(ckpt, step), "full_state", "trainer_state.json").write_text("{}")


def recs(ckpt: Path, event: str | None = None) -> list[dict[str, Any]]:
    out = read_all(ckpt / "journal.jsonl").records
    return [r for r in out if event is None or r["event"] == event]


def test_a_report_after_train_end_is_journaled_and_seen_by_every_reader(ckpt: Path) -> None:
    write_run(ckpt, steps=10, save_every=5)
    on_disk(ckpt, 5, 10)
    last = recs(ckpt)[-1]
    proc = cli(
        "ilab-journal",
        "report",
        str(ckpt),
        "--checkpoint",
        ckpt_path(ckpt, 5),
        "accuracy=0.81",
        "judge=gpt",
        "passed=true",
    )
    assert proc.returncode == 0, proc.stderr
    rec = recs(ckpt)[-1]
    assert rec["event"] == "report" and rec["data"]["id"] == proc.stdout.strip()
    assert rec["data"]["metrics"] == {"accuracy": 0.81, "judge": "gpt", "passed": True}
    assert rec["data"]["step"] == 5  # from the checkpoint's name
    # one writer's record: same run and attempt, seq continues, the file stays valid
    assert (rec["run_id"], rec["attempt"], rec["seq"]) == (
        last["run_id"],
        last["attempt"],
        last["seq"] + 1,
    )
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
    show = cli("ilab-journal", "show", str(ckpt), "-e", "report")
    assert "step-000005" in show.stdout and "accuracy=0.81" in show.stdout
    q = cli("ilab-journal", "query", str(ckpt), "--event", "report", "--field", "metrics.accuracy")
    assert q.stdout.strip() == "0.81"
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["reports"] == 1 and status["last_report"]["metrics"]["accuracy"] == 0.81
    assert status["state"] == "completed"  # a report does not reopen the run


def test_ilab_watch_on_report_sees_reports_written_after_train_end(
    ckpt: Path, tmp_path: Path
) -> None:
    write_run(ckpt, steps=4, save_every=2)
    on_disk(ckpt, 2, 4)
    cli("ilab-journal", "report", str(ckpt), "--checkpoint", ckpt_path(ckpt, 2), "accuracy=0.5")
    out = tmp_path / "seen.txt"
    proc = cli(
        "ilab-watch",
        str(ckpt),
        "--replay",
        "--on-report",
        f"sh -c 'echo $ILAB_EVENT {{checkpoint_path}} >> {out}'",
    )
    assert proc.returncode == 0, proc.stderr
    assert out.read_text().split() == ["report", ckpt_path(ckpt, 2)]


def test_a_report_while_the_journal_is_being_written_waits_for_its_writer(ckpt: Path) -> None:
    write_run(ckpt, steps=4, save_every=2, end=None)
    before = (ckpt / "journal.jsonl").read_bytes()
    writer_lock = JournalLock(ckpt, role="trainer")
    assert writer_lock.try_acquire()  # a trainer is writing
    try:
        proc = cli("ilab-journal", "report", str(ckpt), "--step", "2", "loss_eval=1.5")
        assert proc.returncode == 0, proc.stderr
        assert (ckpt / "journal.jsonl").read_bytes() == before  # not written beside it
        assert len(pending(ckpt)) == 1  # handed in
    finally:
        writer_lock.release()
    from journal.channels.reports import drain

    drain(ckpt, role="trainer")  # what the trainer does after releasing
    assert [r["data"]["metrics"] for r in recs(ckpt, "report")] == [{"loss_eval": 1.5}]
    assert pending(ckpt) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["accuracy"], "expected name=value"),
        (["=3"], "expected name=value"),
        (["bad name=1"], "invalid metric name"),
        ([], "at least one metric"),
        (["accuracy=nan"], "not a finite number"),
    ],
)
def test_bad_reports_are_one_line_and_write_nothing(
    ckpt: Path, args: list[str], message: str
) -> None:
    write_run(ckpt)
    before = (ckpt / "journal.jsonl").read_bytes()
    proc = cli("ilab-journal", "report", str(ckpt), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert (ckpt / "journal.jsonl").read_bytes() == before and pending(ckpt) == []


def test_keep_best_needs_a_number_for_its_metric(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max"}})
    before = (ckpt / "journal.jsonl").read_bytes()
    proc = cli("ilab-journal", "report", str(ckpt), "--step", "1", "accuracy=high")
    assert proc.returncode == 2 and "must be a number" in proc.stderr, proc.stderr
    assert (ckpt / "journal.jsonl").read_bytes() == before and pending(ckpt) == []
    ok = cli("ilab-journal", "report", str(ckpt), "--step", "1", "accuracy=0.5", "note=fine")
    assert ok.returncode == 0, ok.stderr


def test_query_best_names_the_best_surviving_checkpoint(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max"}})
        for step, acc in ((2, 0.9), (4, 0.5), (6, 0.7)):
            on_disk(ckpt, step)
            w.append("evaluate", {"val_loss": 1.0 / step}, step=step)
            w.append("save", {"checkpoint_path": ckpt_path(ckpt, step)}, step=step)
            w.append(
                "report",
                {
                    "checkpoint_path": ckpt_path(ckpt, step),
                    "step": step,
                    "metrics": {"accuracy": acc},
                },
                step=step,
            )
        w.append("checkpoint_removed", {"checkpoint_path": ckpt_path(ckpt, 2), "reason": "x"})
    q = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert q.returncode == 0 and q.stdout.strip() == ckpt_path(ckpt, 6)  # step 2 is gone
    q = cli("ilab-journal", "query", str(ckpt), "--best", "val_loss:min", "--field", "value")
    assert q.returncode == 0 and float(q.stdout) == pytest.approx(1 / 6)  # from evaluate
    none = cli("ilab-journal", "query", str(ckpt), "--best", "bleu:max")
    assert none.returncode == 1 and "bleu" in none.stderr
    bad = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:up")
    assert bad.returncode == 2 and "METRIC:max" in bad.stderr
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["best_checkpoint"]["checkpoint_path"] == ckpt_path(ckpt, 6)
    assert status["best_checkpoint"]["value"] == 0.7
    text = cli("ilab-journal", "status", str(ckpt)).stdout
    assert "keep_best accuracy:max" in text and "step-000006 (accuracy 0.7)" in text


def test_leases_from_the_cli(ckpt: Path) -> None:
    (ckpt / "checkpoints" / "step-000004").mkdir(parents=True)
    lease = cli("ilab-journal", "lease", str(ckpt), ckpt_path(ckpt, 4), "--ttl", "60")
    assert lease.returncode == 0, lease.stderr
    lid = lease.stdout.strip()
    assert leases.leased(ckpt, {"step-000004"}) == {"step-000004"}
    assert cli("ilab-journal", "release", str(ckpt), lid).returncode == 0
    assert leases.leased(ckpt, {"step-000004"}) == set()
    again = cli("ilab-journal", "release", str(ckpt), lid)
    assert again.returncode == 2 and f"no lease '{lid}'" in again.stderr
    missing = cli("ilab-journal", "lease", str(ckpt), "step-000099")
    assert missing.returncode == 2 and "no such checkpoint" in missing.stderr
    outside = cli("ilab-journal", "lease", str(ckpt), "/elsewhere/step-000004")
    assert outside.returncode == 2 and "not a checkpoint of" in outside.stderr


def test_a_lease_that_is_not_renewed_expires_and_is_cleaned(ckpt: Path) -> None:
    (ckpt / "checkpoints" / "step-000002").mkdir(parents=True)
    held = leases.acquire(ckpt, "step-000002", ttl=5)
    now = time.time()
    assert leases.leased(ckpt, {"step-000002"}, now=now) == {"step-000002"}
    renewed = leases.renew(ckpt, held)
    assert renewed.expires > held.expires
    assert leases.leased(ckpt, {"step-000002"}, now=now + 60) == set()  # expired
    assert list((ckpt / "leases").iterdir()) == []  # and cleaned on the way
    with pytest.raises(leases.LeaseError):
        leases.renew(ckpt, renewed)


REPORTING_SCRIPT = textwrap.dedent(
    """
    import json, os
    step = int(os.environ["ILAB_STEP"])
    with open(os.environ["ILAB_REPORT"], "w") as f:
        json.dump({"accuracy": step / 100}, f)
    """
)


def test_replay_skips_removed_checkpoints_and_reports_for_the_rest(
    ckpt: Path, tmp_path: Path
) -> None:
    """A finished run whose early checkpoints were rotated: --replay exits 0, the removed
    ones are skipped (not failed), the others run and report through $ILAB_REPORT."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        for step in (2, 4, 6):
            on_disk(ckpt, step)
            w.append("save", {"checkpoint_path": ckpt_path(ckpt, step)}, step=step)
        for step in (2, 4):
            shutil.rmtree(ckpt_path(ckpt, step))
            w.append(
                "checkpoint_removed", {"checkpoint_path": ckpt_path(ckpt, step), "reason": "r"}
            )
        w.append("train_end", {"status": "completed"}, step=6)
    script = tmp_path / "eval.py"
    script.write_text(REPORTING_SCRIPT)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--on-save", str(script))
    assert proc.returncode == 0, proc.stderr
    assert "2 skipped" in proc.stderr
    results = [
        json.loads(x)
        for x in next((ckpt / "watch").glob("*.results.jsonl")).read_text().splitlines()
    ]
    assert sorted((r["step"], r["status"]) for r in results) == [
        (2, "skipped"),
        (4, "skipped"),
        (6, "ok"),
    ]
    reports = recs(ckpt, "report")
    assert [(r["data"]["checkpoint_path"], r["data"]["metrics"]) for r in reports] == [
        (ckpt_path(ckpt, 6), {"accuracy": 0.06})
    ]
    assert (
        reports[0]["data"]["delivery_id"]
        == next(r for r in results if r["step"] == 6)["delivery_id"]
    )
    assert not list((ckpt / "leases").glob("*.json"))  # every lease released


def test_a_python_callback_returns_reports(ckpt: Path, tmp_path: Path) -> None:
    write_run(ckpt, steps=4, save_every=2)
    on_disk(ckpt, 2, 4)
    mod = tmp_path / "cb.py"
    mod.write_text(
        textwrap.dedent(
            """
            from journal import Report

            class Judge:
                def on_save(self, event, checkpoint_path, **data):
                    return [Report(score=event.step * 1.5), Report({"other/metric": 1})]
            """
        )
    )
    proc = cli("ilab-watch", str(ckpt), "--replay", "--callback", f"{mod}:Judge")
    assert proc.returncode == 0, proc.stderr
    got = [(r["data"]["step"], r["data"]["metrics"]) for r in recs(ckpt, "report")]
    assert got == [
        (2, {"score": 3.0}),
        (2, {"other/metric": 1}),
        (4, {"score": 6.0}),
        (4, {"other/metric": 1}),
    ]
    assert all("Judge.on_save" in r["data"]["source"] for r in recs(ckpt, "report"))
