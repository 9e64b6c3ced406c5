"""``decide``: what a step boundary does, from schedules, commands and signals."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import TrainingArgs
from trainer.steering.decisions import decide, export_decision
from trainer.steering.policy import ABORT, EVALUATE, LOG, SAVE, STOP, Actions


def args(**kw: object) -> TrainingArgs:
    base = {"ckpt_dir": Path("/tmp/unused"), "demo": True, "log_every": 1}
    return TrainingArgs.model_validate({**base, **kw})


def test_nothing_due_does_nothing_but_log_every_step() -> None:
    assert decide(3, 0, False, args()) == Actions(log=True)
    assert decide(3, 0, False, args(log_every=2)) == Actions()


def test_schedules() -> None:
    a = args(log_every=5, eval_every=4, save_every=6)
    assert decide(12, 0, False, a) == Actions(evaluate=True, save="interval")
    assert decide(10, 0, False, a) == Actions(log=True)
    assert decide(7, 0, False, a) == Actions()


@pytest.mark.parametrize(
    ("commands", "interrupted", "end", "save"),
    [
        (ABORT | STOP, True, "abort", None),  # abort beats stop and interrupt, never saves
        (ABORT | SAVE, False, "abort", None),  # ... not even a commanded save
        (STOP, True, "stop", "control"),  # stop beats interrupt; the save is the command's
        (0, True, "interrupt", "interrupt"),
        (SAVE, True, "interrupt", "control"),  # a commanded save names the command
        (STOP, False, "stop", "control"),
    ],
)
def test_ending_precedence(commands: int, interrupted: bool, end: str, save: str | None) -> None:
    act = decide(5, commands, interrupted, args(save_every=5))
    assert (act.end, act.save) == (end, save)


def test_commands_add_to_schedules() -> None:
    a = args(log_every=100)
    assert decide(3, LOG | EVALUATE | SAVE, False, a) == Actions(
        log=True, evaluate=True, save="control"
    )
    # abort still logs and evaluates what was asked: only the save is withheld
    assert decide(3, ABORT | LOG | EVALUATE, False, a) == Actions(
        log=True, evaluate=True, end="abort"
    )


@pytest.mark.parametrize(
    ("step", "why", "ending", "expected"),
    [
        (4, "interval", None, (True, None)),  # a multiple of export_every
        (2, "interval", None, (False, "export_every=4")),
        (6, "interval", "stop", (True, None)),  # the save that ends the run always exports
        (10, "interval", None, (True, None)),  # the last step
        (3, "interrupt", "interrupt", "interrupt"),  # never on interrupt: sharded state only
        (4, "control", "interrupt", "interrupt"),
    ],
)
def test_export_decision(
    tmp_path: Path, step: int, why: str, ending: str | None, expected: object
) -> None:
    args = TrainingArgs(ckpt_dir=tmp_path, demo=True, export_every=4)
    got = export_decision(args, step, 10, why, ending)  # type: ignore[arg-type]
    if expected == "interrupt":
        assert got[0] is False and got[1] is not None and got[1].startswith("interrupt")
    else:
        assert got == expected
    off = TrainingArgs(ckpt_dir=tmp_path, demo=True, save_hf=False)
    assert export_decision(off, step, 10, why, ending) == (False, None)  # type: ignore[arg-type]


def saves_at(a: TrainingArgs, batch: int, steps: int) -> list[int]:
    """The steps ``decide`` saves at over a run of ``steps`` steps of ``batch`` samples."""
    out = []
    for step in range(1, steps + 1):
        if decide(step, 0, False, a, samples_seen=step * batch, step_samples=batch).save:
            out.append(step)
    return out


@pytest.mark.parametrize(
    ("save_samples", "batch", "expected"),
    [
        (16, 8, [2, 4, 6, 8]),  # a multiple of the batch: exactly at each multiple
        (20, 8, [3, 5, 8]),  # 24 >= 20, 40 >= 40, 64 >= 60: the first boundary past each
        (5, 8, [1, 2, 3, 4, 5, 6, 7, 8]),  # smaller than a batch: once per step, not twice
        (100, 8, []),  # never reached in 64 samples
    ],
)
def test_save_samples_saves_at_the_first_step_boundary_past_each_multiple(
    save_samples: int, batch: int, expected: list[int]
) -> None:
    assert saves_at(args(save_samples=save_samples), batch, 8) == expected


def test_save_samples_beside_save_every_and_under_abort() -> None:
    a = args(save_samples=20, save_every=2)
    assert saves_at(a, 8, 6) == [2, 3, 4, 5, 6]
    # abort still never saves, even when the samples count is due
    assert decide(3, ABORT, False, a, samples_seen=24, step_samples=8).save is None
    # resumed mid-run: the count carries on from the checkpoint's samples_seen
    assert decide(8, 0, False, args(save_samples=20), 64, 8).save == "interval"
    assert decide(9, 0, False, args(save_samples=20), 72, 8).save is None
