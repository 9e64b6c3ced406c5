"""The steering policy (trainer/steering/policy.py), pure and table-driven: every combination of
command bits and interrupt -> what the step does; every ending -> ``train_end``'s status and
reason; a trainer's capabilities -> the rejection's reason."""

from __future__ import annotations

from itertools import product
from pathlib import Path
from typing import Any

import pytest

from trainer.steering.control_poller import ControlPoller
from trainer.steering.policy import (
    ABORT,
    BITS,
    EVALUATE,
    LOG,
    SAVE,
    STATUS,
    STOP,
    Actions,
    Capabilities,
    Ending,
    ending,
    ending_command,
    steer,
    train_end,
)


def expected(bits: int, interrupted: bool) -> Actions:
    """The policy written out the long way (docs/python-api.md, "Control commands")."""
    if bits & ABORT:
        return Actions(log=bool(bits & LOG), evaluate=bool(bits & EVALUATE), end="abort")
    end = "stop" if bits & STOP else "interrupt" if interrupted else None
    save = "control" if bits & (SAVE | STOP) else "interrupt" if interrupted else None
    return Actions(log=bool(bits & LOG), evaluate=bool(bits & EVALUATE), save=save, end=end)  # type: ignore[arg-type]


@pytest.mark.parametrize(("bits", "interrupted"), list(product(range(32), (False, True))))
def test_every_command_combination(bits: int, interrupted: bool) -> None:
    assert steer(bits, interrupted) == expected(bits, interrupted)


@pytest.mark.parametrize(
    ("bits", "interrupted", "strongest"),
    [
        (0, False, None),
        (LOG, False, "log"),
        (LOG | EVALUATE, False, "evaluate"),
        (EVALUATE | SAVE, False, "save"),
        (SAVE | STOP, False, "stop"),
        (0, True, "stop"),  # an interrupt: save and end
        (ABORT | STOP | SAVE, True, "abort"),
    ],
)
def test_the_strongest_single_word(bits: int, interrupted: bool, strongest: str | None) -> None:
    assert steer(bits, interrupted).strongest == strongest


@pytest.mark.parametrize(
    ("how", "status", "reason"),
    [
        ("completed", "completed", "reached step 7"),
        ("stop", "stopped", "stop command: enough"),
        ("abort", "stopped", "abort command: enough"),
        ("interrupt", "interrupted", "SIGTERM at step 7"),
        ("stopped", "stopped", "stopped at step 7"),
        ("failed", "failed", "RuntimeError: boom"),
    ],
)
def test_every_ending(how: Ending, status: str, reason: str) -> None:
    cmd = {"command": how, "id": "c1", "reason": "enough", "source": "eval:acc.py"}
    got = train_end(how, 7, signal="SIGTERM", command=cmd, error="RuntimeError: boom")
    assert (got["status"], got["reason"]) == (status, reason)
    assert STATUS[how] == status
    if how in ("stop", "abort"):  # who sent it: status tells an eval's stop from an operator's
        assert (got["command"], got["command_id"], got["command_source"]) == (
            how,
            "c1",
            "eval:acc.py",
        )
    else:
        assert "command" not in got


def test_endings_without_details() -> None:
    assert train_end("interrupt", 3)["reason"] == "a signal on another rank at step 3"
    assert train_end("stop", 3) == {
        "status": "stopped",
        "reason": "stop command",
        "command": "stop",
        "command_id": None,
        "command_source": None,
    }


@pytest.mark.parametrize(
    ("end", "finished", "how"),
    [
        (None, True, "completed"),
        (None, False, "stopped"),
        ("stop", True, "stop"),
        ("abort", False, "abort"),
        ("interrupt", True, "interrupt"),
    ],
)
def test_how_a_run_ended(end: str | None, finished: bool, how: str) -> None:
    assert ending(end, finished=finished) == how  # type: ignore[arg-type]


def test_the_ending_command_is_the_applied_record_of_that_command() -> None:
    applied = [{"command": "save", "id": "a"}, {"command": "stop", "id": "b"}]
    assert ending_command(applied, "stop") == applied[1]
    assert ending_command(applied, "interrupt") is None
    assert ending_command(applied, None) is None


def test_capabilities() -> None:
    every = Capabilities("ilab-train")
    assert all(every.supports(c) and every.refusal(c) is None for c in BITS)
    lit = every.adding({"evaluate": "no eval set"})
    assert not lit.supports("evaluate") and lit.supports("stop")
    assert lit.refusal("evaluate") == "ilab-train cannot evaluate: no eval set"
    with pytest.raises(ValueError, match="unknown command"):
        Capabilities("x", {"fly": "no wings"})


def test_the_poller_rejects_what_the_trainer_cannot_do(tmp_path: Path) -> None:
    from journal import send_command

    poller = ControlPoller(
        tmp_path, set(), capabilities=Capabilities("the X bridge", {"evaluate": "no eval set"})
    )
    poller.start()
    try:
        send_command(tmp_path, "evaluate", command_id="e1")
        send_command(tmp_path, "save", command_id="s1")
        poller.watch.changed = True
        assert poller.poll() == SAVE
        records: list[dict[str, Any]] = []
        poller.journal(lambda event, data: records.append(data), step=4)
    finally:
        poller.close()
    assert [(r["id"], r["accepted"], r["reason"]) for r in records] == [
        ("e1", False, "the X bridge cannot evaluate: no eval set"),
        ("s1", True, None),
    ]
    assert not list((tmp_path / "control").glob("*.json"))  # both archived
