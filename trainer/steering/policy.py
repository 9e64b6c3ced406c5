"""The steering policy, in one place for ``ilab-train``'s loop and every bridge: what the
control commands and signals agreed at a step boundary make that step do (:func:`steer`),
which commands a trainer can carry out at all (:class:`Capabilities`), and what the run's
end becomes in ``train_end`` (:func:`train_end`). No torch: every function is pure.

Precedence, as HF documents ``TrainerControl``:

- **Ending**: ``abort`` > ``stop`` > an interrupt (SIGTERM/SIGINT on any rank).
- **Saving**: ``abort`` never saves, not even a commanded save. Otherwise a checkpoint is
  written when commanded (``save``) or when the run ends by ``stop`` or interrupt; the
  trigger names the strongest reason: ``control`` > ``interrupt`` (a schedule's save,
  ``interval``, is the trainer's: :func:`trainer.steering.decisions.decide` adds it).
- **Logging and evaluation**: whenever commanded, also at the step that ends the run.

The bits come out of the step's one all-reduce (the loop's metrics reduce, a bridge's
:meth:`trainer.journaling.inbox.SteeringInbox.agree`), so every rank steers the same way at the
same step. A command the trainer cannot carry out never gets there: rank 0's poller
rejects it (:meth:`Capabilities.refusal`) like a stale or unknown one, with a ``control``
record (``accepted: false`` and the reason) and one console line.

A new command: its name in ``journal/record/events.py``'s ``CONTROL_COMMANDS`` (what
``ilab-journal control`` sends), and its bit and what it does here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from journal.record.events import CONTROL_COMMANDS

#: The control commands' bits in the step's agreement (one float of the all-reduce).
STOP, ABORT, SAVE, EVALUATE, LOG = 1, 2, 4, 8, 16
BITS = {"stop": STOP, "abort": ABORT, "save": SAVE, "evaluate": EVALUATE, "log": LOG}
assert set(BITS) == set(CONTROL_COMMANDS)

EndReason = Literal["abort", "stop", "interrupt"]
SaveTrigger = Literal["interval", "control", "interrupt"]

#: How a run ended: at a step boundary by a command (``stop``, ``abort``) or a signal
#: (``interrupt``); ``completed`` (its schedule ran out); ``stopped`` by the trainer itself
#: (an HF ``EarlyStoppingCallback``: no command of ours); ``failed`` with an exception.
Ending = Literal["completed", "stop", "abort", "interrupt", "stopped", "failed"]

#: ``train_end``'s ``status`` for each ending (docs/journal-format.md).
STATUS: dict[Ending, str] = {
    "completed": "completed",
    "stop": "stopped",
    "abort": "stopped",
    "stopped": "stopped",
    "interrupt": "interrupted",
    "failed": "failed",
}


@dataclass(frozen=True)
class Actions:
    """What to do at this step boundary, in this order: log, evaluate, save, end."""

    log: bool = False
    evaluate: bool = False
    save: SaveTrigger | None = None  # None: no checkpoint at this step
    end: EndReason | None = None  # None: training goes on

    @property
    def strongest(self) -> str | None:
        """The one command name that says the most (an interrupt reads as ``stop``: save
        and end), for a loop that takes a single word (``JournalTracker.poll_control``)."""
        if self.end is not None:
            return "abort" if self.end == "abort" else "stop"
        if self.save is not None:
            return "save"
        return "evaluate" if self.evaluate else "log" if self.log else None


def steer(commands: int, interrupted: bool) -> Actions:
    """What the agreed command bits and interrupt flag ask of this step boundary (no
    schedule: see :func:`trainer.steering.decisions.decide` for the loop's)."""
    end: EndReason | None = None
    if commands & ABORT:
        end = "abort"
    elif commands & STOP:
        end = "stop"
    elif interrupted:
        end = "interrupt"
    save: SaveTrigger | None = None
    if end != "abort":
        if commands & (SAVE | STOP):
            save = "control"
        elif interrupted:
            save = "interrupt"
    return Actions(log=bool(commands & LOG), evaluate=bool(commands & EVALUATE), save=save, end=end)


def command_names(bits: int) -> list[str]:
    """The command names in a bit mask, in a fixed order."""
    return [name for name, bit in BITS.items() if bits & bit]


@dataclass(frozen=True)
class Capabilities:
    """Which control commands a trainer can carry out.

    Args:
        trainer: who, as the rejection says it (``the Lightning bridge``).
        cannot: command -> why not; every other command is carried out.
    """

    trainer: str
    cannot: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = set(self.cannot) - set(BITS)
        if unknown:
            raise ValueError(
                f"cannot: unknown command(s) {', '.join(sorted(unknown))}; "
                f"expected some of {', '.join(BITS)}"
            )

    def supports(self, command: str) -> bool:
        return command in BITS and command not in self.cannot

    def refusal(self, command: str) -> str | None:
        """The rejection's reason when this trainer cannot carry ``command`` out, else None."""
        why = self.cannot.get(command)
        return None if why is None else f"{self.trainer} cannot {command}: {why}"

    def adding(self, cannot: Mapping[str, str] | None) -> Capabilities:
        """These, less the commands a user declared their trainer cannot do."""
        return Capabilities(self.trainer, {**self.cannot, **(cannot or {})})


def ending(end: EndReason | None, *, finished: bool = True) -> Ending:
    """How a run ended: by the command or signal of its last agreed step (``end``), else
    ``completed`` when its schedule ran out, else ``stopped`` by the trainer itself."""
    if end is not None:
        return end
    return "completed" if finished else "stopped"


def train_end(
    how: Ending,
    step: int,
    *,
    signal: str | None = None,
    command: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """``train_end``'s ``status`` and ``reason`` (plus ``command`` and ``command_id`` when a
    command ended it) for a run that ended ``how`` at ``step``.

    Args:
        signal: the signal this rank received (an interrupt; None: another rank's).
        command: the applied ``control`` record of the ending command (its id and reason).
        error: a failure's one line (``failed``).
    """
    status = STATUS[how]
    if how in ("stop", "abort"):
        given = (command or {}).get("reason")
        reason = f"{how} command" + (f": {given}" if given else "")
        return {
            "status": status,
            "reason": reason,
            "command": how,
            "command_id": (command or {}).get("id"),
            "command_source": (command or {}).get("source"),  # who stopped it (status)
        }
    reason = {
        "interrupt": f"{signal or 'a signal on another rank'} at step {step}",
        "completed": f"reached step {step}",
        "stopped": f"stopped at step {step}",
    }.get(how, error or f"failed at step {step}")  # failed: its error
    return {"status": status, "reason": reason}


def ending_command(applied: list[dict[str, Any]], end: EndReason | None) -> dict[str, Any] | None:
    """The applied ``control`` record of the command that ended the run, if one did."""
    return next((c for c in applied if c.get("command") == end), None) if end else None
