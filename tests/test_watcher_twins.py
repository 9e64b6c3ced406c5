"""One process per watcher cursor (issue 33): a second ``ilab-watch`` with the same state dir
and name is refused (exit 3, one line naming the first one's pid) instead of running every
delivery a second time; the lock a ``kill -9`` leaves behind is taken over; and the watcher
``run_training`` embeds takes the same lock for its cursor."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from journal import JournalWriter
from tests.helpers import BIN, cli, kill_tree, wait_for
from watcher.embedded import EmbeddedWatcher
from watcher.engine.cursor import CursorBusy


def _recorder(tmp_path: Path) -> tuple[Path, Path]:
    """A hook that appends its ``ILAB_DELIVERY_ID`` to a file, and that file."""
    seen, hook = tmp_path / "seen.txt", tmp_path / "rec.sh"
    hook.write_text(f'#!/bin/sh\necho "$ILAB_DELIVERY_ID" >> {seen}\n')
    hook.chmod(0o755)
    return hook, seen


def _follow(ckpt: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _cursor_written(ckpt: Path) -> bool:
    """The first watcher has read the journal and saved its cursor: it is following."""
    return any((ckpt / "watch").glob("*.cursor.json"))


def _saves_and_end(w: JournalWriter, ckpt: Path, steps: tuple[int, ...]) -> None:
    for s in steps:
        path = ckpt / "checkpoints" / f"step-{s:06d}"
        path.mkdir(parents=True)
        w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=s)
    w.append("train_end", {"status": "completed"}, step=steps[-1])
    w.close()


def test_a_second_watcher_on_the_same_cursor_exits_3_and_nothing_runs_twice(
    ckpt: Path, tmp_path: Path
) -> None:
    hook, seen = _recorder(tmp_path)
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}})
    first = _follow(ckpt, "--on-save", str(hook))  # same hooks: the same default --name
    try:
        wait_for(lambda: first.poll() is not None or _cursor_written(ckpt), 60, "first cursor")
        assert first.poll() is None
        second = cli("ilab-watch", str(ckpt), "--on-save", str(hook), timeout=60)
        assert second.returncode == 3, second.stderr
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert f"pid {first.pid}" in lines[0] and "--name" in lines[0]
        _saves_and_end(w, ckpt, (2, 4, 6))
        _, err = first.communicate(timeout=60)
        assert first.returncode == 0, err
    finally:
        kill_tree(first.pid)
    ids = seen.read_text().split()
    assert len(ids) == 3 and len(set(ids)) == 3  # each save once, in one watcher


def test_the_lock_a_killed_watcher_left_is_taken_over(ckpt: Path, tmp_path: Path) -> None:
    hook, seen = _recorder(tmp_path)
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}})
    first = _follow(ckpt, "--on-save", str(hook))
    wait_for(lambda: first.poll() is not None or _cursor_written(ckpt), 60, "first cursor")
    (lock,) = (ckpt / "watch").glob("*.lock")
    assert json.loads(lock.read_text())["pid"] == first.pid
    kill_tree(first.pid)  # kill -9: the lock file still names it
    _saves_and_end(w, ckpt, (2, 4))
    again = cli("ilab-watch", str(ckpt), "--on-save", str(hook), timeout=60)
    assert again.returncode == 0, again.stderr
    assert f"pid {first.pid}" in again.stderr and "taking over" in again.stderr
    assert len(seen.read_text().split()) == 2


def test_the_embedded_watcher_takes_the_same_lock(ckpt: Path, tmp_path: Path) -> None:
    """``ilab-watch --name embedded`` beside ``run_training(on_save=...)`` would share its
    results file and running markers: whichever comes second is refused."""
    hook, _ = _recorder(tmp_path)
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
    squatter = _follow(ckpt, "--on-save", str(hook), "--name", "embedded")
    try:
        wait_for(lambda: squatter.poll() is not None or _cursor_written(ckpt), 60, "cursor")
        with pytest.raises(CursorBusy, match=f"pid {squatter.pid}"):
            EmbeddedWatcher(ckpt, hooks={"save": [print]}, callbacks=[], start_offset=0)
    finally:
        kill_tree(squatter.pid)
