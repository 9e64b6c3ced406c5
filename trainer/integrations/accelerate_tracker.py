"""The journal for a hand-written Accelerate loop: ``Accelerator(log_with=JournalTracker(dir))``.

::

    from accelerate import Accelerator
    from trainer.integrations.accelerate_tracker import JournalTracker

    journal = JournalTracker("runs/acc")
    accelerator = Accelerator(log_with=journal)
    accelerator.init_trackers("my-run", config={"lr": 1e-4})        # -> train_begin
    for step, batch in enumerate(loader, start=1):
        ...
        accelerator.log({"loss": loss.item(), "lr": lr}, step=step)  # -> log
        if step % 100 == 0:
            accelerator.save_state(f"runs/acc/checkpoints/step-{step:06d}")
            journal.save(f"runs/acc/checkpoints/step-{step:06d}", step)  # after it is complete
        command = journal.poll_control(step)  # every rank: the agreed command, or None
        if command in ("stop", "abort"):
            break
    accelerator.end_training()                                       # -> train_end

``log`` and ``store_init_configuration`` write on the main process; ``poll_control`` must be
called by every rank at the same step (it is one all_reduce). An exception that ends the
program is journaled as ``train_end`` failed.

What the commands ask of the step is the steering policy's (:mod:`trainer.steering.policy`), the
one ``ilab-train`` and the other bridges follow: ``poll_actions`` returns all of it
(``log``, ``evaluate``, ``save``: ``"control"`` or ``"interrupt"``, ``end``: ``"abort"``,
``"stop"`` or ``"interrupt"``); ``poll_control`` the strongest single word. The loop is
yours, so declare what it does not do, ``JournalTracker(dir, cannot={"evaluate": "no eval
set"})``: such a command is rejected, with that reason in the journal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from accelerate.state import PartialState
from accelerate.tracking import GeneralTracker

from trainer.integrations.common import Steering, open_journal
from trainer.journaling.emitter import Where
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import Actions, Capabilities


class JournalTracker(GeneralTracker):
    """An Accelerate tracker that writes an ilab-journal (see the module docstring)."""

    name = "ilab-journal"
    requires_logging_directory = False
    main_process_only = False  # every rank opens the session: poll_control is collective

    #: The loop carries the commands out, so by default every one is accepted.
    capabilities = Capabilities("this Accelerate loop")

    def __init__(
        self,
        ckpt_dir: str | os.PathLike[str],
        total_steps: int | None = None,
        cannot: dict[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.capabilities = self.capabilities.adding(cannot)
        self.ckpt_dir = Path(ckpt_dir)
        self.total_steps = total_steps
        self.run_journal: RunJournal | None = None
        self.device = torch.device("cpu")
        #: The loop's position as far as it told us (the step of its last call): the
        #: journal follows it.
        self.where = Where()
        self.steering = Steering()

    @property
    def tracker(self) -> RunJournal | None:
        return self.run_journal

    def start(self) -> None:
        state = PartialState()
        # The writer is rank 0 of the process group once one exists. Accelerate's own notion
        # can disagree: an Accelerator made without cpu=True on a machine with no GPU runs
        # "not distributed" under torchrun, and every rank then calls itself the main one.
        main = dist.get_rank() == 0 if dist.is_initialized() else state.is_main_process
        self.device = torch.device(state.device)
        self.run_journal = open_journal(
            self.ckpt_dir,
            main=main,
            role="accelerate",
            capabilities=self.capabilities,
            resume=False,
            position=self.where,
        )

    def _journal(self) -> RunJournal:
        if self.run_journal is None:
            self.start()
        assert self.run_journal is not None
        return self.run_journal

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._journal().begin(
            values, total_steps=self.total_steps, device_type=self.device.type, trainer="accelerate"
        )

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        j = self._journal()
        if step is not None:
            self.where.step = step
        numbers = {k: v for k, v in values.items() if isinstance(v, (int, float))}
        j.emit(
            "log",
            {
                **numbers,
                "loss": numbers.get("loss", numbers.get("train_loss")),
                "lr": numbers.get("lr", numbers.get("learning_rate")),
            },
        )

    def save(self, path: str | os.PathLike[str], step: int) -> None:
        """Journal a checkpoint once it is complete on disk (after ``save_state``)."""
        j = self._journal()
        self.where.step = step
        j.emit(
            "save",
            {
                "checkpoint_path": str(Path(path).resolve()),
                "kind": ["full_state"],
                "duration": None,
            },
        )

    def poll_actions(self, step: int) -> Actions:
        """Every rank, at the same step: what the agreed commands and signals ask of this
        step (the steering policy's :class:`~trainer.steering.Actions`)."""
        j = self._journal()
        self.where.step = step
        return self.steering.step(j, self.device, step)

    def poll_control(self, step: int) -> str | None:
        """Every rank, at the same step: the command to apply now (``stop``, ``abort``,
        ``save``, ``evaluate`` or ``log``; the strongest when several arrived, an interrupt
        reading as ``stop``), or None. :meth:`poll_actions` gives all of them."""
        return self.poll_actions(step).strongest

    def finish(self) -> None:
        self.steering.finish(self._journal(), self.where.step, None)
