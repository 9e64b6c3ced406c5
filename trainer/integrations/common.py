"""What the three bridges share: opening rank 0's journal the bridges' way
(:func:`open_journal`), the trainer's step counter as the records' position
(:class:`StepPosition`) and following the steering policy from step to step to the run's
``train_end`` (:class:`Steering`). A bridge adds only what its trainer's hooks differ in."""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from trainer.journaling.emitter import Position
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import (
    Actions,
    Capabilities,
    EndReason,
    command_names,
    ending,
    ending_command,
    steer,
    train_end,
)

log = logging.getLogger(__name__)


def open_journal(
    run_dir: str | os.PathLike[str],
    *,
    main: bool,
    role: str,
    capabilities: Capabilities,
    resume: bool,
    position: Position,
) -> RunJournal:
    """A bridge's journal, open on every rank (``main`` writes): SIGTERM/SIGINT finish the
    step and end it as interrupted, ``resume`` continues the journal of an earlier attempt,
    an exception no hook sees ends it as ``failed``, and each record carries ``position``."""
    journal = RunJournal(run_dir, main=main, role=role, capabilities=capabilities)
    journal.catch_signals()
    journal.open(resume=resume)
    journal.fail_on_uncaught_exception()
    journal.follow(position)
    return journal


class StepPosition:
    """A trainer's step counter (``counters.global_step``) as the journal's position. Inside
    a step (``in_step``) the trainer has not counted it yet: its records carry
    ``global_step + 1``. ``samples_seen`` counts the samples of the steps done, ``per_step``
    on all ranks each (0 where the bridge does not know it), so it follows a resume too."""

    def __init__(self, counters: Any, per_step: int = 0) -> None:
        self.counters = counters
        self.per_step = per_step
        self.in_step = False

    @property
    def step(self) -> int:
        return int(self.counters.global_step) + (1 if self.in_step else 0)

    @property
    def epoch(self) -> int:
        return int(self.counters.epoch or 0)

    @property
    def samples_seen(self) -> int:
        return int(self.counters.global_step) * self.per_step


class Steering:
    """The steering policy across a bridge's steps: the commands and signals agreed at each
    step, and the first ending they asked for (with its command's ``control`` record), which
    becomes ``train_end``."""

    def __init__(self) -> None:
        self.end: EndReason | None = None  # what ended the run, by the steering policy
        self.end_command: dict[str, Any] | None = None  # the ending command's control record

    def step(self, journal: RunJournal, device: torch.device, step: int) -> Actions:
        """Every rank, at the same step (one all-reduce): what the agreed commands and
        signals ask of ``step``; the first ending is kept for :meth:`finish`."""
        agreed = journal.inbox.agree(device, signalled=bool(journal.interrupted))
        act = steer(agreed.bits, agreed.interrupted)
        if act.end is not None and self.end is None:
            self.end, self.end_command = act.end, ending_command(agreed.applied, act.end)
        if agreed.bits and journal.main:  # the console line ilab-train's loop prints too
            names = "+".join(command_names(agreed.bits))
            log.info("control %s applied at step %d", names, step)
        return act

    def finish(
        self, journal: RunJournal, step: int, final: str | None, *, finished: bool = True
    ) -> None:
        """Write ``train_end`` at ``step`` (the policy's status and reason; ``final`` the
        last complete checkpoint) and close the journal. ``finished``: the trainer's
        schedule ran out (else the trainer stopped itself, with no command of ours)."""
        how = ending(self.end, finished=finished)
        signal = journal.interrupted[0] if journal.interrupted else None
        fields = train_end(how, step, signal=signal, command=self.end_command)
        journal.end({**fields, "final_checkpoint": final})
        journal.close()
