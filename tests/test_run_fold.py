"""The one fold of a run (journal/views/fold.py) and the views that read it tell the same
story as the disk: the issue's run, where an eval slower than the saves reports after
``train_end`` and the watcher removes checkpoints with paths relative to its own working
directory, while the trainer journaled absolute ones."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from journal.views import index
from journal.views.fold import RunFold
from journal.write.writer import JournalWriter
from tests.helpers import begin_payload, cli, make_checkpoint


def _late_eval_run(ckpt: Path, cwd: Path) -> None:
    """keep_last_n=2, keep_best=acc:max; saves at 10..60; the trainer removes 10 and 20;
    train_end names step 30 as best (the evals were behind); the reports land afterwards,
    and the watcher's prune removes 30 and 40, spelling them relative to ``cwd``."""
    config = {"keep_last_n": 2, "keep_best": "acc:max"}
    w = JournalWriter(ckpt)
    w.append("train_begin", begin_payload(60, config=config))
    absolute = ckpt.resolve() / "checkpoints"
    for step in range(10, 70, 10):
        make_checkpoint(ckpt, step, w.run_id)
        w.append("save", {"checkpoint_path": str(absolute / f"step-{step:06d}")}, step=step)
        if step == 30:
            w.append(
                "report",
                {
                    "checkpoint_path": str(absolute / "step-000030"),
                    "step": 30,
                    "metrics": {"acc": 0.03},
                },
                step=step,
            )
        if step >= 30:  # the trainer keeps the two newest and the best (30, until 60's report)
            old = step - 20
            if old in (10, 20):
                shutil.rmtree(absolute / f"step-{old:06d}")
                w.append(
                    "checkpoint_removed",
                    {"checkpoint_path": str(absolute / f"step-{old:06d}"), "reason": "rotation"},
                    step=step,
                )
    best30 = {"checkpoint_path": str(absolute / "step-000030"), "metric": "acc", "value": 0.03}
    w.append("train_end", {"status": "completed", "best_checkpoint": best30}, step=60)
    relative = os.path.relpath(ckpt, cwd)
    for step in (40, 50, 60):
        w.append(
            "report",
            {
                "checkpoint_path": f"{relative}/checkpoints/step-{step:06d}/",  # another spelling
                "step": step,
                "metrics": {"acc": step / 1000},
            },
            step=60,
        )
    for step in (30, 40):
        shutil.rmtree(absolute / f"step-{step:06d}")
        w.append(
            "checkpoint_removed",
            {
                "checkpoint_path": f"./{relative}/checkpoints/step-{step:06d}",
                "reason": "rotation: keep_last_n=2",
                "by": "watcher",
            },
            step=60,
        )
    w.close()


@pytest.fixture
def run(tmp_path: Path) -> Path:
    ckpt = tmp_path / "runs" / "b"
    ckpt.mkdir(parents=True)
    _late_eval_run(ckpt, tmp_path)
    return ckpt


def test_each_checkpoint_is_one_row_with_the_fate_the_disk_shows(run: Path) -> None:
    fold = index.summarize(run / "journal.jsonl", use_index=False).fold
    rows = {v.fate.name: v for v in fold.checkpoints()}
    assert sorted(rows) == [f"step-{s:06d}" for s in range(10, 70, 10)]  # once each
    on_disk = sorted(n for n, v in rows.items() if v.on_disk)
    assert on_disk == sorted(os.listdir(run / "checkpoints"))  # what `ls` shows
    assert {n: v.state for n, v in rows.items()} == {
        "step-000010": "removed",
        "step-000020": "removed",
        "step-000030": "removed",
        "step-000040": "removed",
        "step-000050": "on_disk",
        "step-000060": "on_disk",
    }
    # every path in one spelling, inside the run dir, whoever journaled it
    assert {v.fate.path for v in rows.values()} == {
        str(run.resolve() / "checkpoints" / n) for n in rows
    }
    removal = rows["step-000040"].fate.removed
    assert removal is not None and removal.by == "watcher" and removal.after_end
    assert rows["step-000060"].best and not rows["step-000050"].best


def test_the_best_comes_from_the_reports_not_from_train_ends_snapshot(run: Path) -> None:
    fold = index.summarize(run / "journal.jsonl", use_index=False).fold
    best = fold.best("acc:max")
    assert best is not None and Path(best.checkpoint_path).name == "step-000060"
    assert best.value == pytest.approx(0.06)
    status = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
    assert Path(status["best_checkpoint"]["checkpoint_path"]).name == "step-000060"
    query = cli("ilab-journal", "query", str(run), "--best", "acc:max")
    assert "step-000060" in query.stdout, query.stdout + query.stderr


def test_the_index_answers_what_a_full_read_does(run: Path) -> None:
    journal = run / "journal.jsonl"
    index.save(journal, index.advance(journal, None))
    assert index.load(journal) is not None
    fast, full = index.summarize(journal).fold, index.summarize(journal, use_index=False).fold
    assert fast.summary(now=1e12) == full.summary(now=1e12)
    assert [v.to_dict() for v in fast.checkpoints()] == [v.to_dict() for v in full.checkpoints()]


def test_the_writers_live_fold_starts_again_when_the_journal_is_cut_under_it(
    tmp_path: Path,
) -> None:
    """The writer keeps its fold in memory and folds on from where it was; a journal cut to
    nothing under it (logrotate's copytruncate) is folded again from byte 0, so the fold the
    trainer's keep_best asks and the index say what a full read of the file says."""
    run = tmp_path / "run"
    with JournalWriter(run) as w:
        w.append("train_begin", begin_payload(30, config={"keep_best": "acc:max"}))

        def saved(step: int, acc: float) -> None:
            path = str(make_checkpoint(run, step, w.run_id))
            save = {"checkpoint_path": path, "kind": ["full_state"], "duration": 0}
            w.append("save", save, step=step)
            w.append("report", {"checkpoint_path": path, "metrics": {"acc": acc}}, step=step)

        saved(10, 0.9)
        saved(20, 0.5)
        live = w.live_fold()
        assert live is not None and [f.name for f in live.fates] == ["step-000010", "step-000020"]
        os.truncate(w.path, 0)
        saved(30, 0.1)
        live = w.live_fold()
    full = index.summarize(w.path, use_index=False).fold
    saved_index = index.load(w.path)
    assert live is not None and saved_index is not None
    assert [f.name for f in live.fates] == ["step-000030"]
    assert live.to_state() == full.to_state() == saved_index.fold.to_state()
    best = live.best("acc:max")
    assert best is not None and Path(best.checkpoint_path).name == "step-000030"


def test_a_symlinked_or_relative_run_dir_gives_the_same_paths(run: Path, tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(run, target_is_directory=True)
    records = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    answers = []
    for given in (run, link, Path(os.path.relpath(run))):
        fold = RunFold(given)
        fold.add_batch(records)
        answers.append([(v.fate.path, v.state) for v in fold.checkpoints()])
    assert answers[0] == answers[1] == answers[2]
