"""The journal and its control channel for ``lightning.pytorch.Trainer``.

::

    from trainer.integrations.lightning import JournalCallback

    trainer = L.Trainer(..., callbacks=[ModelCheckpoint(...), JournalCallback()])
    trainer.fit(model, data)

Rank 0 writes ``<default_root_dir>/journal.jsonl`` (or ``ckpt_dir``) in the format
``ilab-train`` writes, so ``ilab-watch``, ``ilab-journal`` and reports work unchanged:
``train_begin``, ``epoch_begin/end``, ``step_begin/end``, ``before/after_optimizer_step``,
``log`` (the step's loss), ``evaluate`` (every logged metric after a validation run),
``save`` (once the checkpoint file is written: the callback wraps the strategy's
``CheckpointIO``, so ``ModelCheckpoint``'s saves and ``trainer.save_checkpoint`` are both
seen after the write) and ``train_end`` on every exit: completed, stopped, ``failed`` on an
exception (``on_exception``) and ``interrupted`` on SIGTERM/SIGINT.

Control commands (``ilab-journal control stop|abort|save|evaluate|log DIR``) are read by
rank 0 and agreed on by every rank in one ``all_reduce`` of a small tensor at each step end
(:meth:`trainer.journaling.inbox.SteeringInbox.agree`, shared with the HF bridge), then applied
at the same step everywhere, as the steering policy (:mod:`trainer.steering.policy`) says: ``stop``
saves a checkpoint and sets ``trainer.should_stop``, ``abort`` stops without saving, ``save``
saves one. Each is journaled as a ``control`` record. ``evaluate`` is rejected (a
``control`` record with ``accepted: false`` and the reason): Lightning validates on its own
schedule and the bridge cannot start a validation run.

Checkpoints: ``ModelCheckpoint`` keeps its own ``save_top_k`` rotation, and leases hold it
back. ``ilab-watch`` leases the ``.ckpt`` file of each ``save`` while its ``--on-save``
delivery is queued or running (``ilab-journal lease DIR FILE`` takes one by hand); a
``.ckpt`` file anywhere in the run dir can be leased (journal/checkpoints/leases.py names it by its path
relative to the run dir). When ``ModelCheckpoint`` asks to delete a leased file, rank 0
keeps it, journals ``checkpoint_kept`` and looks again at each step end and at train end
(one listing of ``leases/``): once the lease is released or expired, the file is deleted
and ``checkpoint_removed`` journaled, the way the journal's own rotation deletes
(:func:`journal.checkpoints.rotation.remove_unless_leased`). Files outside the run dir cannot be
leased and are deleted at once: a ``dirpath`` outside it gets one warning at train start and
a note in ``train_begin`` (:func:`unprotected_dirs`). A kept file is not deleted if a later save writes the same
path again; one still leased when training ends stays on disk.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import Callback

from journal.checkpoints import leases
from journal.checkpoints.leases import LeaseError
from journal.checkpoints.rotation import finish_interrupted_removals, remove_unless_leased
from journal.rundir.paths import checkpoints_dir
from trainer.integrations.common import Steering, StepPosition, open_journal
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import Capabilities

log = logging.getLogger(__name__)


class LightningPosition(StepPosition):
    """The Trainer's counters as the journal's position (no samples count)."""

    @property
    def epoch(self) -> int:
        return int(self.counters.current_epoch)


_ROTATION = "ModelCheckpoint rotation"


class JournalCheckpointIO(CheckpointIO):
    """The strategy's own ``CheckpointIO``, with a ``save`` record once a file is written
    and a ``checkpoint_removed`` record once one is deleted; a leased file is kept until its
    lease ends (rank 0: Lightning calls it there only)."""

    def __init__(self, inner: CheckpointIO, journal: RunJournal) -> None:
        self.inner, self.journal = inner, journal
        self.trigger = "lightning"  # the callback says "control" for the saves it asks for
        self.last: str | None = None  # the newest complete checkpoint
        self.kept: dict[str, Path] = {}  # lease name -> file, deletions held back by a lease

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        t = time.perf_counter()
        self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        if Path(path).exists():  # a complete file: the write above returned
            self.last = str(Path(path).resolve())
            # a kept file written again is a new checkpoint: no longer to be deleted
            self.kept = {n: kept for n, kept in self.kept.items() if kept != Path(self.last)}
            self.journal.emit(
                "save",
                {
                    "checkpoint_path": self.last,
                    "kind": ["full_state"],  # weights, optimizer and loop state
                    "duration": time.perf_counter() - t,
                    "trigger": self.trigger,
                },
            )

    def load_checkpoint(
        self, path: str | Path, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return self.inner.load_checkpoint(
            path, map_location=map_location, weights_only=weights_only
        )

    def remove_checkpoint(self, path: Any) -> None:
        """``ModelCheckpoint``'s deletion: at once unless the file is leased, else later
        (:meth:`remove_released`)."""
        target = Path(path).resolve()
        try:
            name = leases.checkpoint_name(self.journal.dir, target)
        except LeaseError:  # outside the run dir: no lease can hold it
            self.inner.remove_checkpoint(path)
            self._removed(target)
            return
        leased = target.exists() and leases.leased(
            self.journal.dir, {name}, on_reject=self._refused
        )
        if leased or not self._delete(name, target):
            self.kept[name] = target
            log.info("keeping %s: leased", target)
            self.journal.emit(
                "checkpoint_kept", {"checkpoint_path": str(target), "reason": "leased"}
            )

    def remove_released(self) -> None:
        """Delete the kept files whose leases have ended (rank 0, at step and train end):
        one listing of ``leases/``, nothing at all while none is kept."""
        if not self.kept:
            return
        held = leases.leased(self.journal.dir, set(self.kept), on_reject=self._refused)
        for name, target in list(self.kept.items()):
            if name not in held and self._delete(name, target):
                del self.kept[name]

    def _delete(self, name: str, target: Path) -> bool:
        """Delete ``target``, unleased at the last look; True once it is gone (see
        :func:`journal.checkpoints.rotation.remove_unless_leased`: a lease taken since still wins)."""
        if not target.exists():  # gone already (by hand): say so all the same
            self._removed(target)
            return True
        return remove_unless_leased(
            self.journal.dir,
            target,
            name,
            emit=self.journal.emit,
            reason=_ROTATION,
            on_reject=self._refused,
        )

    def _removed(self, target: Path) -> None:
        self.journal.emit(
            "checkpoint_removed", {"checkpoint_path": str(target), "reason": _ROTATION}
        )

    def _refused(self, record: dict[str, Any]) -> None:
        """A file in ``leases/`` that is not a lease: moved aside, journaled."""
        self.journal.emit("control", record)

    def teardown(self) -> None:
        self.inner.teardown()


def unprotected_dirs(trainer: Trainer, run_dir: Path) -> list[str]:
    """One line for each ``ModelCheckpoint`` whose ``dirpath`` lies outside the run dir:
    leases name files inside it only, so its ``save_top_k`` deletes a checkpoint at once,
    even while an ``ilab-watch`` hook still reads it."""
    root = run_dir.resolve()
    out = []
    for cb in trainer.checkpoint_callbacks:
        dirpath = getattr(cb, "dirpath", None)
        if not dirpath:
            continue
        remote = "://" in str(dirpath)  # fsspec (s3://...): never inside a local run dir
        if remote or not Path(dirpath).resolve().is_relative_to(root):
            out.append(
                f"ModelCheckpoint dirpath {dirpath} is outside the run dir {run_dir}: leases "
                "do not cover it, so its save_top_k may delete a checkpoint while an ilab-watch "
                "hook still reads it (put dirpath inside the run dir to protect them)"
            )
    return out


class JournalCallback(Callback):
    """Journals a Lightning run and applies control commands (see the module docstring).

    Args:
        ckpt_dir: where the journal, ``control/`` and ``reports/`` live; default the
            Trainer's ``default_root_dir``. Checkpoints asked for by control commands go to
            ``ModelCheckpoint``'s ``dirpath`` when there is one, else ``ckpt_dir/checkpoints``.
    """

    #: What the bridge can carry out: ``log`` (every step is logged anyway), ``save``,
    #: ``stop`` and ``abort``; not ``evaluate``.
    capabilities = Capabilities(
        "the Lightning bridge",
        {
            "evaluate": "Lightning validates on its own schedule (val_check_interval, "
            "check_val_every_n_epoch); the bridge cannot start a validation run"
        },
    )

    def __init__(self, ckpt_dir: str | os.PathLike[str] | None = None) -> None:
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self._run_journal: RunJournal | None = None
        self.position: LightningPosition | None = None
        self.io: JournalCheckpointIO | None = None
        self.steering = Steering()
        self.step_t0 = time.perf_counter()
        self.begun_at = 0  # global_step when the current step began

    @property
    def journal(self) -> RunJournal:
        assert self._run_journal is not None, "setup has not run"
        return self._run_journal

    # -- start and end -----------------------------------------------------------------

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit" or self._run_journal is not None:
            return
        self.position = LightningPosition(trainer)
        self._run_journal = open_journal(
            self.ckpt_dir or Path(trainer.default_root_dir),
            main=trainer.is_global_zero,
            role="lightning",
            capabilities=self.capabilities,
            resume=bool(trainer.ckpt_path),
            position=self.position,
        )
        self.io = JournalCheckpointIO(trainer.strategy.checkpoint_io, self._run_journal)
        trainer.strategy.checkpoint_io = self.io

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        config = dict(pl_module.hparams)
        config.update(max_steps=trainer.max_steps, max_epochs=trainer.max_epochs)
        notes = unprotected_dirs(trainer, self.journal.dir) if self.journal.main else []
        for note in notes:
            log.warning("%s", note)
        self.journal.begin(
            config,
            total_steps=trainer.max_steps if trainer.max_steps > 0 else None,
            device_type=trainer.strategy.root_device.type,
            trainer="lightning.pytorch.Trainer",
            resumed_from=str(trainer.ckpt_path) if trainer.ckpt_path else None,
            **({"notes": notes} if notes else {}),
        )
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        if dirpath and self.journal.main:  # a file an earlier attempt died deleting
            finish_interrupted_removals(self.journal.dir, self.journal.emit, Path(dirpath))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._end(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "fit" and self._run_journal is not None:
            self._end(trainer)  # a run that never reached on_train_end still ends

    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        if self._run_journal is not None:
            self.journal.fail(exception)
            self.journal.close()

    def _end(self, trainer: Trainer) -> None:
        if self.io is not None and not self.journal.ended:
            self.io.remove_released()  # leases released during the last steps
        last = self.io.last if self.io is not None else None
        final = last if last and Path(last).is_file() else None
        self.steering.finish(self.journal, trainer.global_step, final)

    # -- the step ------------------------------------------------------------------------

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.journal.emit("epoch_begin", {})

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.journal.emit("epoch_end", {"epoch": trainer.current_epoch})

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        assert self.position is not None
        if not self.position.in_step:  # the first micro-batch of an optimizer step
            self.step_t0 = time.perf_counter()
            self.begun_at = trainer.global_step
            self.position.in_step = True
            self.journal.emit("step_begin")

    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Any
    ) -> None:
        self.journal.emit("before_optimizer_step")

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        assert self.position is not None
        if not self.position.in_step or trainer.global_step == self.begun_at:
            return  # accumulating gradients: the optimizer has not stepped yet
        self.position.in_step = False  # Lightning has counted the step
        j = self.journal
        j.emit("after_optimizer_step")
        self._log(trainer, outputs)
        # evaluate never comes: the poller rejects it (capabilities)
        act = self.steering.step(j, trainer.strategy.root_device, trainer.global_step)
        if act.end is not None:
            trainer.should_stop = True
        if act.save is not None:
            self._save(trainer)
        if self.io is not None:
            self.io.remove_released()  # kept files whose leases have ended
        j.emit("step_end", {})

    # -- metrics and checkpoints ----------------------------------------------------------

    def _log(self, trainer: Trainer, outputs: Any) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        elapsed = time.perf_counter() - self.step_t0
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        lr = trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None
        self.journal.emit(
            "log",
            {
                **metrics,
                "loss": float(loss) if isinstance(loss, torch.Tensor) else None,
                "lr": lr,
                "elapsed_time": elapsed,
            },
        )

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or self._run_journal is None:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}
        self.journal.emit("evaluate", {**metrics, "val_loss": metrics.get("val_loss")})

    def _save(self, trainer: Trainer) -> None:
        """Every rank, at the same step (Lightning's save is collective): a checkpoint the
        control channel asked for, journaled by :class:`JournalCheckpointIO` once written."""
        dirpath = getattr(trainer.checkpoint_callback, "dirpath", None)
        root = Path(dirpath) if dirpath else checkpoints_dir(self.journal.dir)
        path = root / f"control-step={trainer.global_step}.ckpt"
        assert self.io is not None
        self.io.trigger = "control"
        try:
            trainer.save_checkpoint(path)
        finally:
            self.io.trigger = "lightning"
