"""``decide``: what a step boundary does, from schedules, commands and signals."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import TrainingArgs
from trainer.control_poller import ABORT, EVALUATE, LOG, SAVE, STOP
from trainer.decisions import Actions, decide


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
