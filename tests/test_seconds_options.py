"""Every option that takes seconds refuses nan, inf and negatives in one line (exit 2):
click's FloatRange let nan through every bound, so ``status --stale-after nan`` called a
dead run running for ever and ``ilab-watch --lease-ttl nan`` delivered saves unleased."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from journal.write.writer import JournalWriter
from tests.helpers import cli


def stale_run(tmp_path: Path) -> Path:
    """A run whose trainer stopped writing long ago without a train_end."""
    run = tmp_path / "run"
    with JournalWriter(run) as w:
        w.append("train_begin", {"config": {}}, ts=time.time() - 3600)
    return run


@pytest.mark.parametrize(
    ("tool", "args", "option"),
    [
        ("ilab-journal", ["status", "{run}", "--stale-after", "nan"], "--stale-after"),
        ("ilab-journal", ["status", "{run}", "--stale-after", "inf"], "--stale-after"),
        ("ilab-journal", ["status", "{run}", "--stale-after", "-1"], "--stale-after"),
        ("ilab-journal", ["tail", "{run}", "--interval", "nan"], "--interval"),
        ("ilab-journal", ["control", "stop", "{run}", "--wait=nan"], "--wait"),
        ("ilab-journal", ["control", "stop", "{run}", "--wait=inf"], "--wait"),
        ("ilab-journal", ["lease", "{run}", "step-000001", "--ttl", "nan"], "--ttl"),
        ("ilab-watch", ["{run}", "--on-save", "true", "--lease-ttl", "nan"], "--lease-ttl"),
        ("ilab-watch", ["{run}", "--on-save", "true", "--timeout", "nan"], "--timeout"),
        ("ilab-watch", ["{run}", "--on-save", "true", "--backoff", "inf"], "--backoff"),
        ("ilab-watch", ["{run}", "--on-save", "true", "--poll", "nan"], "--poll"),
        (
            "ilab-watch",
            ["{run}", "--on-save", "true", "--via", "local", "--job-poll", "nan"],
            "--job-poll",
        ),
        (
            "ilab-watch",
            ["{run}", "--on-save", "true", "--via", "local", "--job-poll", "inf"],
            "--job-poll",
        ),
        ("ilab-watch", ["{run}", "--mirror", "file:///tmp/x", "--linger", "nan"], "--linger"),
    ],
)
def test_seconds_that_are_not_a_finite_range_are_one_line(
    tmp_path: Path, tool: str, args: list[str], option: str
) -> None:
    run = stale_run(tmp_path)
    before = sorted(p.name for p in run.iterdir())
    proc = cli(tool, *[a.format(run=run) for a in args], timeout=30)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"Error: {option} ") and "expected a finite number of seconds" in line
    assert sorted(p.name for p in run.iterdir()) == before  # nothing written, no watcher ran


def test_a_stale_run_is_stale_with_any_finite_stale_after(tmp_path: Path) -> None:
    run = stale_run(tmp_path)
    assert cli("ilab-journal", "status", str(run), "--stale-after", "60").returncode == 6
    assert cli("ilab-journal", "status", str(run), "--stale-after", "0").returncode == 6
