"""Callback pacing (trainer/steering/callback_pacing.py): rank 0 waits before a step's
all-reduce until the launcher's paced callbacks handled the step before, within bounds."""

from __future__ import annotations

import threading
from pathlib import Path

from trainer.steering.callback_pacing import CallbackPacer, read_progress
from watcher.builtin.foreign import Progress


class Owner:
    """A stand-in for one paced adapter (Progress keys them by identity)."""


def test_no_wait_for_steps_written_before_this_attempt_or_already_handled(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p", tmp_path)
    pacer = CallbackPacer(progress.path, first_step=11, limit_s=30)
    assert pacer.wait(11) == 0.0  # step 10 was a former attempt's: never delivered now
    a = Owner()
    progress.register(a)
    progress.done(a, 11)
    assert read_progress(progress.path) == 11
    assert pacer.wait(12) == 0.0 and pacer.on


def test_progress_is_the_slowest_paced_callbacks_step(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p", tmp_path)
    a, b = Owner(), Owner()
    progress.register(a)
    progress.register(b)
    progress.done(a, 5)
    assert read_progress(progress.path) == 0
    progress.done(b, 4)
    assert read_progress(progress.path) == 4


def test_the_wait_ends_when_the_callbacks_catch_up(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p", tmp_path)
    a = Owner()
    progress.register(a)
    pacer = CallbackPacer(progress.path, first_step=1, limit_s=60)
    done = threading.Event()
    t = threading.Thread(target=lambda: (pacer.wait(3), done.set()), daemon=True)
    t.start()
    progress.done(a, 1)  # not enough: step 2 is awaited
    assert not done.wait(0.2)
    progress.done(a, 2)
    assert done.wait(30) and pacer.on


def test_a_stuck_callback_ends_pacing_after_the_limit(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p", tmp_path)
    progress.register(Owner())
    pacer = CallbackPacer(progress.path, first_step=1, limit_s=0.05)
    assert pacer.wait(5) >= 0.05 and not pacer.on
    assert pacer.wait(6) == 0.0  # off for the rest of the attempt


def test_an_interrupt_ends_the_wait(tmp_path: Path) -> None:
    progress = Progress(tmp_path / "p", tmp_path)
    progress.register(Owner())
    pacer = CallbackPacer(progress.path, first_step=1, limit_s=60, interrupted=lambda: True)
    pacer.wait(5)
    assert pacer.on


def test_callbacks_already_caught_up_make_the_step_read_control_at_once(tmp_path: Path) -> None:
    """Callbacks that kept up (no wait) may have just written a command: the step's poll
    reads control/ now instead of waiting for its directory watcher to notice (it could
    notice a step later, and the stop would apply one step late); a step with no new
    progress does not force a read."""
    from trainer.steering.dir_watch import DirWatch

    control = tmp_path / "control"
    control.mkdir()
    watch = DirWatch(control)
    progress = Progress(tmp_path / "p", tmp_path)
    a = Owner()
    progress.register(a)
    pacer = CallbackPacer(progress.path, first_step=1, limit_s=60, control=watch)
    progress.done(a, 3)  # handled up to step 3, a command written before that counted
    watch.changed = False
    assert pacer.wait(4) == 0.0 and watch.changed
    watch.changed = False
    assert pacer.wait(4) == 0.0 and not watch.changed  # nothing new since: no forced read
