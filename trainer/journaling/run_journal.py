"""The run session: one implementation for ``ilab-train``'s loop and for the bridges
(:mod:`trainer.integrations`).

Every rank of a run holds a :class:`RunJournal`. Every rank catches SIGTERM/SIGINT (the
flag rides the step's agreement, so all ranks end at the same boundary). The main rank
(rank 0) alone opens the attempt through the store (:func:`journal.store.open_attempt`:
the lock, whether this attempt continues the journal's run, the writer), writes the
records, keeps the best checkpoint (``keep_best``), and measures what all of it costs. What flows in at step boundaries,
control commands and reports, is the session's steering inbox (``RunJournal.inbox``,
:class:`trainer.journaling.inbox.SteeringInbox`), which it starts when it opens.

A record's position comes from the training state the journal follows
(:meth:`RunJournal.follow`): the loop never tells it the step.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import signal
import socket
import sys
import time
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from journal.channels.reports import drain
from journal.checkpoints.rotation import rotate
from journal.rundir.lock import JournalLock
from journal.rundir.phase import PhaseMarker
from journal.store import Resume, open_attempt
from journal.views.best import BestCheckpoint, MetricGoal
from trainer.journaling.emitter import Emitter, Position, failure_payload
from trainer.journaling.inbox import SteeringInbox
from trainer.steering.policy import Capabilities

log = logging.getLogger("trainer")

LOCK_WAIT_S = 60.0  # for a previous attempt's orphans to save and end
RESERVE_BYTES = 256 * 1024  # for train_end (with its traceback) when the disk fills up


def versions() -> dict[str, str]:
    """What ``train_begin`` records as ``versions``: Python, torch and the packages installed
    of ilab-journal, transformers and accelerate."""
    out = {"python": platform.python_version(), "torch": torch.__version__}
    for pkg in ("ilab-journal", "transformers", "accelerate"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def jsonable(value: Any) -> Any:
    """Configs hold enums and paths: keep what JSON can say."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class RunJournal:
    """One run's session on one rank: its journal opened, records, signals and end; its
    :attr:`inbox` holds the control commands and reports.

    Args:
        ckpt_dir: the run dir: ``journal.jsonl``, ``control/``, ``reports/``, checkpoints.
        main: whether this rank writes (rank 0).
        role: who writes, for ``ilab-journal status`` (``trainer``, ``hf-trainer``, ...).
        detail: ``step``, ``microbatch`` or ``off`` (no records; control still works).
        keep_best: ``METRIC:max|min``: the best checkpoint is kept by rotation and named
            in ``train_end``.
        capabilities: the commands this trainer can carry out (others are rejected).
    """

    def __init__(
        self,
        ckpt_dir: str | os.PathLike[str],
        *,
        main: bool,
        role: str,
        detail: str = "step",
        keep_best: str | None = None,
        capabilities: Capabilities | None = None,
    ) -> None:
        self.dir = Path(ckpt_dir)
        self.main, self.role, self.detail = main, role, detail
        self.goal = MetricGoal.parse(keep_best) if keep_best else None
        self.emitter = Emitter(None, detail)
        # Every rank polls it (each takes part in the step's agreement); open() starts its
        # readers on the main rank.
        self.inbox = SteeringInbox(
            self.dir,
            emit=self.emit,
            step=lambda: self.emitter.position.step,  # the emitter is replaced by open()
            capabilities=capabilities,
        )
        self.lock: JournalLock | None = None
        self._run_id: str | None = None  # set by open()
        self.interrupted: list[str] = []  # the signal seen on this rank
        self.ended = False
        self.saved = False  # a checkpoint saved by this attempt (a relaunch's progress)
        self.t0 = time.perf_counter()

    # -- opening ---------------------------------------------------------------------------

    def catch_signals(self) -> None:
        """SIGTERM/SIGINT on this rank: finish the step, save, end as interrupted. (Not on
        the main thread: the handlers stay as they are.)"""
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)

    def open(self, resume: Resume = "auto", *, relaunch: bool = False) -> Path | None:
        """The main rank: open the attempt through the store (:func:`~journal.store.open_attempt`:
        the journal lock, waiting up to ``LOCK_WAIT_S`` for a previous attempt's workers to
        save and end, :class:`JournalLocked` after; the writer by the resume rule) and start
        reading control commands and reports. Returns the checkpoint to resume from
        (``resume="auto"``, found once the lock is held); None on the other ranks.
        ``relaunch``: the launcher launches this run again (``max_restarts``): it goes on,
        from its newest checkpoint or, with none yet, from the start."""
        if not self.main:
            return None
        attempt = open_attempt(
            self.dir,
            resume,
            self.role,
            relaunch=relaunch,
            records=self.detail != "off",
            wait=LOCK_WAIT_S,
            reserve_bytes=RESERVE_BYTES,
        )
        self.lock, self._run_id = attempt.lock, attempt.run_id
        if attempt.writer is not None:
            self.emitter = Emitter(attempt.writer, self.detail, self.emitter.position)
        try:
            self.inbox.start(attempt.commands_seen, reports=attempt.writer is not None)
        except BaseException:
            self.lock.release()
            raise
        return attempt.resume_from

    def fail_on_uncaught_exception(self) -> None:
        """The main rank: an exception nobody catches ends the journal as ``failed`` (a
        trainer that calls no hook then), before the previous hook prints it as usual."""
        if not self.main:
            return
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            with contextlib.suppress(Exception):
                self.fail(exc)
                self.close()
            previous(kind, exc, tb)

        sys.excepthook = hook

    def follow(self, position: Position) -> None:
        """Stamp every record from now on with this state's step, epoch and samples seen."""
        self.emitter.position = position

    @property
    def world(self) -> int:
        """The number of ranks (1 without a process group)."""
        return dist.get_world_size() if dist.is_initialized() else 1

    def phases(self) -> PhaseMarker:
        """The long phases that stop steps legitimately (lease and callback waits, saves,
        evals), declared by the journal's writer for the hang detector
        (journal/rundir/phase.py); on other ranks, and without a journal, nothing."""
        writes = self.main and self.emitter.writer is not None
        return PhaseMarker(self.dir if writes else None, run_id=self.run_id, attempt=self.attempt)

    @property
    def attempt(self) -> int | None:
        """This attempt's number in its run (the main rank, once open; None elsewhere)."""
        w = self.emitter.writer
        return w.attempt if w is not None else None

    @property
    def run_id(self) -> str | None:
        """The run of this attempt (the main rank, once open; None elsewhere): the journal's,
        which its checkpoints name and rotation keeps to."""
        return self._run_id

    # -- records -----------------------------------------------------------------------------

    def emit(self, event: str, data: dict[str, Any] | None = None) -> None:
        """Append a record (the main rank; nothing elsewhere)."""
        self.emitter.emit(event, data)
        self.saved = self.saved or event == "save"

    def emit_micro(self, event: str, data: dict[str, Any]) -> None:
        """Per-micro-batch events, recorded only at ``detail="microbatch"``."""
        self.emitter.emit_micro(event, data)

    def begin(
        self,
        config: dict[str, Any],
        *,
        total_steps: int | None,
        device_type: str,
        resumed_from: str | None = None,
        **extra: Any,
    ) -> None:
        """The ``train_begin`` record; ``extra`` fields are the trainer's own."""
        world = self.world
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        self.emit(
            "train_begin",
            {
                "config": jsonable(config),
                "world_size": world,
                "nnodes": max(1, world // per_node),
                "device_type": device_type,
                "journal_detail": self.detail,
                "resumed_from": resumed_from,
                "total_steps": total_steps if total_steps is not None else 0,
                **extra,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "versions": versions(),
            },
        )

    def end(self, payload: dict[str, Any], *, step_time_s: float | None = None) -> None:
        """The ``train_end`` record, once: reports that came in meanwhile first, then the
        best checkpoint and the measured cost (see :meth:`cost`)."""
        if self.ended:
            return
        self.inbox.ingest_reports()
        best = self.best_checkpoint()
        self.emit(
            "train_end",
            {
                **payload,
                "best_checkpoint": best.to_dict() if best else None,
                "journal": self.cost(step_time_s),
            },
        )
        self.ended = True

    def fail(
        self, exc: BaseException, reason: str | None = None, facts: Mapping[str, Any] | None = None
    ) -> None:
        """``train_end`` failed (with ``facts``: what follows it, the launcher's relaunch),
        unless the run's ``train_end`` is written already."""
        if self.ended:
            return
        self.ended = True
        self.emit(
            "train_end", {**failure_payload(exc, reason), **(facts or {}), "journal": self.cost()}
        )

    def close(self) -> None:
        """Stop reading the inbox, close the writer, release the lock, then journal the
        reports that came in after the last look. Safe to call twice."""
        self.inbox.close()
        self.emitter.close()
        if self.lock is not None and self.lock.held:
            self.lock.release()
            drain(self.dir, role=self.role)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.interrupted:
            name = signal.Signals(signum).name
            self.interrupted.append(name)
            log.warning("%s received: finishing the step, then saving and ending", name)

    # -- checkpoints -------------------------------------------------------------------------

    def best_checkpoint(self) -> BestCheckpoint | None:
        """The best checkpoint of this run still on disk (``keep_best``), or None: from the
        writer's live fold of the journal, the one ``status`` reads, read on to the end first
        (reports and verdicts journaled since count), and from what the folds of the files
        it wrote before a cut of the journal knew."""
        w, goal = self.emitter.writer, self.goal
        if w is None or goal is None or (fold := w.live_fold()) is None:
            return None
        best = None
        for f in (*w.folds_before_cut, fold):  # (a new run's fold before its train_begin:
            if f.run_id in (None, self.run_id):  # the last run's, not this one's)
                b = f.best(goal, self.dir)
                best = b if best is None or (b and goal.better(b.value, best.value)) else best
        return best

    def rotate(
        self, keep_last_n: int | None, *, keep: set[str] | None = None, root: Path | None = None
    ) -> None:
        """The main rank, after a ``save`` record: delete the checkpoints beyond the newest
        ``keep_last_n``, except the best (reports that came in count first), ``keep`` and
        leased ones; each removal is journaled."""
        if not self.main:
            return
        self.inbox.ingest_reports()
        names = set(keep or ())
        best = self.best_checkpoint()
        if best is not None:
            names.add(Path(best.checkpoint_path).name)
        owner = self.run_id if root is None else None  # a bridge's (in root) name no run
        rotate(self.dir, keep_last_n, keep=names, emit=self.emit, root=root, run_id=owner)

    def cost(self, step_time_s: float | None = None) -> dict[str, Any]:
        """Time inside the journal, measured directly on this rank: appends, and the inbox's
        control checks and the bridges' agreement (:meth:`SteeringInbox.cost`), per step of
        this attempt (the inbox's step boundaries) and as a fraction of the step time
        (``step_time_s``: the loop's measured steps; the wall time when not given)."""
        e, steps = self.emitter, max(self.inbox.steps, 1)
        wall = time.perf_counter() - self.t0
        base = wall if step_time_s is None else step_time_s
        hot = e.append_ns - e.durable_ns  # records on the step path, no fsync
        own = e.append_ns + self.inbox.own_ns
        return {
            "records": e.appends,
            "append_ns_total": e.append_ns,
            "append_ns_per_step": e.append_ns / steps,
            "hot_append_ns_per_step": hot / steps,
            "durable_records": e.durable_appends,  # save/control records: fsynced
            "durable_ns_total": e.durable_ns,
            **self.inbox.cost(),  # control checks and the agreement
            "step_time_s_total": step_time_s,
            "train_wall_s": wall,
            "overhead_fraction": own / 1e9 / base if base > 0 else None,
            "hot_overhead_fraction": hot / 1e9 / base if base > 0 else None,
        }
