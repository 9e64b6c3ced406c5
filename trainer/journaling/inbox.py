"""The steering inbox: what flows into a run at its step boundaries, on one rank.

The run's session (:class:`trainer.journaling.run_journal.RunJournal`) holds one
:class:`SteeringInbox` on every rank and starts its readers on the main rank when it opens:
control commands (:class:`~trainer.steering.control_poller.ControlPoller`) and watcher
reports (:class:`~trainer.steering.report_inbox.ReportInbox`). Every rank takes part in a
step's agreement, so every rank polls it; only the main rank reads files. What that costs
is measured here and reported in ``train_end``'s ``journal`` (:meth:`SteeringInbox.cost`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from trainer.steering.control_poller import ControlPoller
from trainer.steering.policy import Capabilities
from trainer.steering.report_inbox import ReportInbox

#: Appends a record to the journal (the session's ``emit``).
Emit = Callable[[str, dict[str, Any]], Any]


class Agreed(NamedTuple):
    """What every rank agreed on at a step (:meth:`SteeringInbox.agree`)."""

    bits: int  # the command bits read on the main rank
    applied: list[dict[str, Any]]  # their ``control`` records (the main rank; empty elsewhere)
    interrupted: bool  # a signal arrived on some rank


class SteeringInbox:
    """One run's control commands and reports, read at step boundaries, on one rank.

    Args:
        ckpt_dir: the run dir (``control/``, ``reports/``).
        emit: appends a record (the session's, which also folds it into the best).
        step: the step the session's records are at (``control`` records carry it).
        capabilities: the commands this trainer can carry out (others are rejected).
    """

    def __init__(
        self,
        ckpt_dir: Path,
        *,
        emit: Emit,
        step: Callable[[], int],
        capabilities: Capabilities | None = None,
    ) -> None:
        self.dir, self.capabilities = ckpt_dir, capabilities
        self._emit, self._step = emit, step
        self.poller: ControlPoller | None = None  # the main rank, once started
        self.reports: ReportInbox | None = None  # ... when the run writes records
        self.steps = 0  # step boundaries seen (poll_control calls)
        self.poll_idle_ns = self.poll_idle_steps = 0  # control checks that found nothing new
        self.poll_busy_ns = self.poll_busy_steps = 0  # ... that read new command files
        self.agree_ns = 0  # the bridges' own all_reduce

    def start(self, seen_ids: set[str], *, reports: bool) -> None:
        """The main rank, as the attempt starts: read commands (``seen_ids``: those
        journaled already) and, when the run writes records, reports."""
        self.poller = ControlPoller(self.dir, seen_ids, capabilities=self.capabilities)
        self.poller.start()  # the attempt starts: command files already there are stale
        if reports:
            self.reports = ReportInbox(self.dir, self._emit)
            self.reports.start()

    def close(self) -> None:
        """Stop watching ``control/`` and ``reports/``. Safe to call twice."""
        for reader in (self.poller, self.reports):
            if reader is not None:
                reader.close()

    # -- control ---------------------------------------------------------------------------

    def poll_control(self) -> int:
        """Every rank, once per step: the bit mask of new control commands (read on the
        main rank; 0 elsewhere) for the step's agreement; timed for the cost report."""
        self.steps += 1
        if self.poller is None:
            return 0
        looked = self.poller.watch.changed  # whether this poll reads the directory
        t = time.perf_counter_ns()
        mask = self.poller.poll()
        dt = time.perf_counter_ns() - t
        if looked:
            self.poll_busy_ns += dt
            self.poll_busy_steps += 1
        else:
            self.poll_idle_ns += dt
            self.poll_idle_steps += 1
        return mask

    def journal_control(self) -> list[dict[str, Any]]:
        """After the agreement: the commands it carried (and any rejections) as ``control``
        records; returns the applied ones (the main rank; empty elsewhere)."""
        if self.poller is None:
            return []
        return self.poller.journal(self._emit, self._step())

    def agree(self, device: torch.device, *, signalled: bool) -> Agreed:
        """For a trainer whose step has no all-reduce of ours (the bridges): every rank, once
        per step, one all_reduce of the command bits and whether a signal arrived on any
        rank (``signalled``: on this one); then the ``control`` records and the reports."""
        bits, anywhere = self.poll_control(), signalled
        if dist.is_initialized() and dist.get_world_size() > 1:
            t = time.perf_counter_ns()
            vec = torch.tensor([float(bits), 1.0 if signalled else 0.0], device=device)
            dist.all_reduce(vec)
            bits_all, signals = vec.tolist()
            self.agree_ns += time.perf_counter_ns() - t
            bits, anywhere = int(bits_all), signals > 0
        applied = self.journal_control()
        self.poll_reports()
        return Agreed(bits, applied, anywhere)

    # -- reports ---------------------------------------------------------------------------

    def poll_reports(self) -> None:
        """At a step boundary: journal new reports (one attribute read when none came)."""
        if self.reports is not None:
            self.reports.poll()

    def ingest_reports(self) -> None:
        """Journal every pending report now (before rotation and ``train_end``)."""
        if self.reports is not None:
            self.reports.ingest_now()

    # -- cost ------------------------------------------------------------------------------

    @property
    def own_ns(self) -> int:
        """Time spent in control checks and the bridges' agreement on this rank."""
        return self.poll_idle_ns + self.poll_busy_ns + self.agree_ns

    def cost(self) -> dict[str, Any]:
        """The inbox's part of ``train_end``'s ``journal`` cost: control checks, idle and
        busy, and the bridges' agreement, per step of this attempt."""
        steps = max(self.steps, 1)
        return {
            "control_idle_ns_per_step": self.poll_idle_ns / max(self.poll_idle_steps, 1),
            "control_busy_steps": self.poll_busy_steps,  # steps that read new command files
            "control_busy_ns_per_step": self.poll_busy_ns / max(self.poll_busy_steps, 1),
            "control_ns_per_step": (self.poll_idle_ns + self.poll_busy_ns) / steps,
            "agree_ns_per_step": self.agree_ns / steps,
        }
