"""The journal and its control channel for HF ``transformers.Trainer`` (and TRL trainers).

::

    from trainer.integrations.hf_trainer import JournalCallback

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[JournalCallback()])
    trainer.train()

The main process writes ``<output_dir>/journal.jsonl`` (or ``ckpt_dir``) in the format
``ilab-train`` writes, so ``ilab-watch``, ``ilab-journal`` and reports work unchanged:
``train_begin``, ``epoch_begin/end``, ``step_begin/end``, ``before/after_optimizer_step``
(HF's ``on_pre_optimizer_step``/``on_optimizer_step``), ``log``, ``evaluate`` (every metric),
``save`` (once ``checkpoint-N`` is complete: HF calls ``on_save`` after writing it) and
``train_end`` on every exit: completed, stopped, ``failed`` on an exception (HF calls no
hook then: an exception hook writes it) and ``interrupted`` on SIGTERM/SIGINT (the step
finishes, the checkpoint is saved, training stops).

Control commands (``ilab-journal control stop|abort|save|evaluate|log DIR``) are read by the
main process and agreed on by every rank in one ``all_reduce`` of a small integer tensor per
step (the cost, measured in ``benchmarks/bench_hf_bridge.py``, is in the README), then
applied through ``TrainerControl`` at the same step everywhere, as the steering policy
(:mod:`trainer.steering.policy`) says: ``stop`` saves and stops, ``abort`` stops without saving.
Each is journaled as a ``control`` record. A trainer that cannot carry a command out (no
eval dataset: ``evaluate`` would raise) declares it, ``JournalCallback(cannot={"evaluate":
"no eval dataset"})``, and such a command is rejected with that reason in the journal.

Checkpoints: HF's ``save_total_limit`` rotation knows nothing of leases; pass
``keep_last_n`` instead and the callback rotates after each save keeping the newest N, HF's
best model checkpoint and every leased one (``ilab-watch`` leases each checkpoint while its
``--on-save`` delivery is queued or running), journaling ``checkpoint_removed``. Not covered
yet: ``keep_best`` by reported metrics.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from trainer.integrations.common import Steering, StepPosition, open_journal
from trainer.journaling.run_journal import RunJournal
from trainer.steering.policy import Capabilities

log = logging.getLogger(__name__)


def samples_per_step(args: Any, state: Any, world: int) -> int:
    """Samples one optimizer step takes on all ranks, as HF counts its total batch size."""
    per_device = getattr(state, "train_batch_size", None) or args.per_device_train_batch_size
    return int(per_device) * int(args.gradient_accumulation_steps) * world


class JournalCallback(TrainerCallback):
    """Journals an HF Trainer run and applies control commands (see the module docstring).

    Args:
        ckpt_dir: where the journal, ``control/`` and ``reports/`` live; default
            ``args.output_dir`` (where HF writes ``checkpoint-N``).
        keep_last_n: rotate checkpoints the journal's way after each save: keep the newest
            N, HF's best model checkpoint, and every leased one (an eval still reading it),
            journaling each removal. Use it instead of HF's ``save_total_limit``, whose
            rotation knows nothing of leases.
        cannot: control commands this run cannot carry out, with why (``{"evaluate": "no
            eval dataset"}``): they are rejected, with the reason journaled.
    """

    #: What the bridge itself can carry out: every command (``TrainerControl`` has a flag
    #: for each).
    capabilities = Capabilities("the HF Trainer bridge")

    def __init__(
        self,
        ckpt_dir: str | os.PathLike[str] | None = None,
        keep_last_n: int | None = None,
        cannot: dict[str, str] | None = None,
    ) -> None:
        if keep_last_n is not None and keep_last_n < 1:
            raise ValueError(f"keep_last_n must be >= 1 (or None to keep all), not {keep_last_n}")
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.keep_last_n = keep_last_n
        self.capabilities = self.capabilities.adding(cannot)
        self._run_journal: RunJournal | None = None
        # HF's TrainerState; per_step: HF's total train batch size (the per-device batch, which
        # auto_find_batch_size may have lowered, times gradient accumulation times the ranks)
        self.position: StepPosition | None = None
        self.device = torch.device("cpu")
        self.steering = Steering()
        self.step_t0 = time.perf_counter()

    @property
    def journal(self) -> RunJournal:
        assert self._run_journal is not None, "on_train_begin has not run"
        return self._run_journal

    # -- start and end -----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.device = torch.device(args.device)
        # samples per step needs the journal's world size: set once it is open (no record
        # is written in between)
        self.position = StepPosition(state)
        self._run_journal = open_journal(
            self.ckpt_dir or args.output_dir,
            main=state.is_world_process_zero,
            role="hf-trainer",
            capabilities=self.capabilities,
            resume=bool(kw.get("resume_from_checkpoint")),
            position=self.position,
        )
        self.position.per_step = samples_per_step(args, state, self.journal.world)
        if args.save_total_limit and state.is_world_process_zero:
            log.warning(
                "save_total_limit=%s: HF's rotation may delete a checkpoint an eval is still "
                "reading (it knows nothing of leases); JournalCallback(keep_last_n=N) keeps "
                "leased ones",
                args.save_total_limit,
            )
        self.journal.begin(
            args.to_dict(),
            total_steps=state.max_steps,
            device_type=self.device.type,
            trainer="transformers.Trainer",
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        # a callback of the user's (EarlyStoppingCallback) may stop it: no command of ours
        finished = not (state.global_step < state.max_steps and control.should_training_stop)
        last = self._ckpt_path(args, state)  # the newest checkpoint, when it was saved
        final = None if self.steering.end == "abort" or not last.is_dir() else str(last)
        self.steering.finish(self.journal, state.global_step, final, finished=finished)

    # -- the step ------------------------------------------------------------------------

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.journal.emit("epoch_begin", {})

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.journal.emit("epoch_end", {"epoch": int(state.epoch or 0)})

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.step_t0 = time.perf_counter()
        if self.position is not None:
            self.position.in_step = True
        self.journal.emit("step_begin")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.journal.emit("before_optimizer_step")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.journal.emit("after_optimizer_step")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self.position is not None:
            self.position.in_step = False  # HF has counted the step
        act = self.steering.step(self.journal, self.device, state.global_step)
        if act.end is not None:
            control.should_training_stop = True
        if act.end == "abort":
            control.should_save = False  # not even the one HF's schedule has due
        elif act.save is not None:
            control.should_save = True
        control.should_evaluate = control.should_evaluate or act.evaluate
        control.should_log = control.should_log or act.log
        self.journal.emit("step_end", {})

    # -- metrics and checkpoints ----------------------------------------------------------

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        logs = dict(logs or {})
        if "loss" not in logs:  # the end-of-training summary and eval logs go elsewhere
            return
        elapsed = time.perf_counter() - self.step_t0
        samples = samples_per_step(args, state, self.journal.world)
        self.journal.emit(
            "log",
            {
                **{k: v for k, v in logs.items() if isinstance(v, (int, float))},
                "loss": logs.get("loss"),
                "lr": logs.get("learning_rate"),
                "grad_norm": logs.get("grad_norm"),
                "elapsed_time": elapsed,
                "samples_per_s": samples / elapsed if elapsed > 0 else None,
                "samples_seen": state.global_step * samples,
            },
        )

    def on_evaluate(
        self, args: Any, state: Any, control: Any, metrics: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        metrics = dict(metrics or {})
        self.journal.emit(
            "evaluate",
            {
                **{k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                "val_loss": metrics.get("eval_loss"),
                "duration": metrics.get("eval_runtime"),
            },
        )

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        """HF calls it after ``checkpoint-N`` is written: the checkpoint is complete."""
        path = self._ckpt_path(args, state)
        self.journal.emit(
            "save",
            {
                "checkpoint_path": str(path),
                "kind": ["hf"],
                "hf_path": str(path),
                "duration": None,
                "trigger": "hf",
            },
        )
        if self.keep_last_n is not None:
            best = state.best_model_checkpoint
            self.journal.rotate(
                self.keep_last_n,
                keep={Path(best).name} if best else set(),
                root=Path(args.output_dir),
            )

    # -- helpers ---------------------------------------------------------------------------

    @staticmethod
    def _ckpt_path(args: Any, state: Any) -> Path:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        return Path(args.output_dir).resolve() / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
