"""A full disk: one clear line, train_end failed with the reason in the journal (from the
writer's reserve), status failed, and a relaunch after space is freed resumes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cli, records, small_tmpfs, train

pytestmark = pytest.mark.dist


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 24 MB tmpfs (root only; skipped where mounting is not allowed)."""
    with small_tmpfs(tmp_path, "24m") as mnt:
        yield mnt


@pytest.mark.extended
def test_a_full_disk_fails_clearly_and_a_relaunch_resumes(
    small_disk: Path, reliability: Any
) -> None:
    ckpt = small_disk / "run"
    args = ("--max-steps", "6", "--save-every", "2")
    # One checkpoint of the demo model is ~14 MB: the second one does not fit in 24 MB.
    full = train(ckpt, *args)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("ilab-train: training failed:") and "No space left" in last
    end = records(ckpt)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert "No space left on device" in end["data"]["reason"]
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0  # no torn train_end
    status = cli("ilab-journal", "status", str(ckpt), "--json")
    assert status.returncode == 1 and json.loads(status.stdout)["state"] == "failed"
    saved = [r["step"] for r in records(ckpt) if r["event"] == "save"]
    assert saved == [2]

    subprocess.run(["mount", "-o", "remount,size=96m", str(small_disk)], check=True)
    again = train(ckpt, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    begins = [r for r in records(ckpt) if r["event"] == "train_begin"]
    assert begins[-1]["data"]["resumed_from"].endswith("step-000002")
    assert records(ckpt)[-1]["data"]["status"] == "completed"
    assert not list((ckpt / "checkpoints").glob(".tmp-*"))  # the torn save was cleaned
    reliability(
        "full disk (24 MB tmpfs), then relaunch with room",
        first_exit=1,
        train_end="failed: no space",
        relaunch="completed from step-000002",
    )


@pytest.mark.extended
def test_a_full_disk_during_a_background_write_fails_clearly_and_keeps_the_last_checkpoint(
    small_disk: Path,
) -> None:
    """--async-save without the consolidated export: the sharded state fails in the
    background thread. One line; train_end failed; no save record and no directory for the
    step that did not fit; the earlier checkpoint is intact and a relaunch resumes from it."""
    ckpt = small_disk / "run"
    args = ("--max-steps", "6", "--save-every", "2", "--no-save-hf", "--keep-last-n", "5")
    full = train(ckpt, *args)
    assert full.returncode == 1, full.stderr[-3000:]
    assert "Traceback" not in full.stderr
    last = full.stderr.strip().splitlines()[-1]
    assert last.startswith("ilab-train: training failed:"), last
    end = records(ckpt)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    saves = [r for r in records(ckpt) if r["event"] == "save"]
    assert saves, "the first checkpoint fits"
    # a partial write stays a .tmp- directory (ignored; removed at the next save)
    on_disk = sorted(p.name for p in (ckpt / "checkpoints").glob("step-*"))
    assert on_disk == [Path(r["data"]["checkpoint_path"]).name for r in saves]

    subprocess.run(["mount", "-o", "remount,size=96m", str(small_disk)], check=True)
    again = train(ckpt, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    begin = [r for r in records(ckpt) if r["event"] == "train_begin"][-1]
    assert begin["step"] == saves[-1]["step"]
