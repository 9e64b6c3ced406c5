"""The distributed training loop, instrumented at every point of the callback proposal.

One optimizer step, in order (``Trainer.train_step``)::

    step_begin
    per micro-batch: before_forward, forward, after_forward, before_backward, backward, after_backward
    before_optimizer_step, clip + step + scheduler + zero_grad, after_optimizer_step
    ONE all-reduce of [loss, tokens, interrupt, control bits, grad norm]: the step's one
        agreed host read
    control records, then what ``decide`` says: log, evaluate, save; step_end

Control commands and signals ride in that all-reduce, so every rank acts at the same step
boundary and no collective is added for them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from journal.rundir.paths import checkpoints_dir, logs_dir, step_dir_name
from trainer.checkpoint import sharded as ckpt
from trainer.checkpoint.async_save import AsyncCheckpointer, CheckpointWriteError, PendingSave
from trainer.config import TrainingArgs
from trainer.config.fields import parse_profile_steps
from trainer.data.plan import StepPlan
from trainer.journaling.run_journal import RunJournal
from trainer.model.device import check_fp32_master, compute_dtype
from trainer.model.lora import export_kind
from trainer.rank.evaluation import validation
from trainer.rank.profiling import StepProfiler
from trainer.rank.startup import Built
from trainer.rank.step_metrics import StepMetrics, log_payload, reset_peak_memory
from trainer.steering.callback_pacing import CallbackPacer
from trainer.steering.decisions import decide, export_decision
from trainer.steering.lease_pacing import LeasePacer, save_scheduled
from trainer.steering.policy import EndReason, command_names, ending_command, train_end

log = logging.getLogger("trainer")

#: Test-only: seconds to sleep in every step, so tests can act while training runs.
STEP_DELAY_ENV = "ILAB_TEST_STEP_DELAY"


@dataclass
class RunOutcome:
    """How an attempt ended (becomes the ``train_end`` payload)."""

    status: str = "completed"
    reason: str | None = None
    final_checkpoint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class Trainer:
    """Holds the training state of one rank; ``run()`` trains until done, stopped or
    interrupted. The journal follows ``state``: every record carries its position."""

    def __init__(
        self, args: TrainingArgs, built: Built, journal: RunJournal, progress: Path | None = None
    ) -> None:
        self.args, self.model, self.device = args, built.model, built.device
        model, device = built.model, built.device
        self.opt, self.sched = built.optimizer, built.scheduler
        self.planner, self.val_planner = built.planner, built.val_planner
        self.state, self.total_steps = built.state, built.total_steps
        self.write_consolidated = built.write_consolidated
        self.journal, self.inbox = journal, journal.inbox  # the inbox: commands and reports
        journal.follow(self.state)
        self.phases = journal.phases()  # lease waits, saves, evals: no hang (docs/alerts.md)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.last_saved_step = self.state.step if self.state.step else -1
        self.step_time_s = 0.0
        self.step_delay = float(os.environ.get(STEP_DELAY_ENV) or 0)
        # Default: reduce-scatter after every micro-batch, so grads stay sharded (a 7B model's
        # unsharded fp32 grads are +28 GB per GPU); skipping the sync is for small models.
        self.ddp = isinstance(model, DistributedDataParallel)  # --sharding replicate
        self.sync_last_only = args.reduce_grads == "last_micro_batch" and (
            self.ddp or isinstance(model, FSDPModule)
        )
        # FSDP casts to bf16 itself (MixedPrecisionPolicy); a DDP replica computes in bf16
        # under autocast, its weights staying fp32.
        self.autocast_bf16 = self.ddp and compute_dtype(args, device) == torch.bfloat16
        # The interrupt flag and control bits reach the device through a pinned buffer and a
        # non-blocking copy: the step's only host sync stays the read after the all-reduce.
        self.flags_host = torch.zeros(2, pin_memory=device.type == "cuda")
        self.precision_checked = False
        self.saver = AsyncCheckpointer() if args.async_save else None
        steps = parse_profile_steps(args.profile_steps) if args.profile_steps else None
        out = logs_dir(args.ckpt_dir) / "profile"
        self.profiler = StepProfiler(steps, out, self.rank, device, self.phases)
        # rank 0 alone paces saves (the others wait in the all-reduce)
        poller, interrupted = self.inbox.poller, lambda: bool(journal.interrupted)
        self.pacer = LeasePacer.for_run(args, poller.watch, interrupted) if poller else None
        self.lease_wait_s = 0.0  # rank 0's wait for leases before the coming save
        # and it runs one step ahead of the launcher's paced callbacks at most
        self.callback_pacer = CallbackPacer.for_run(
            args, progress, built.state.step, poller, interrupted
        )

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> RunOutcome:
        """Train; an asynchronous save still in flight is waited for before the outcome."""
        out = self._train()
        self.profiler.close()  # the run ended inside the profiled steps
        if self.saver is not None:
            with self.phases("save"):
                self._journal_save(self.saver.wait())
        out.final_checkpoint = self._final_path()
        return out

    def _train(self) -> RunOutcome:
        st, a = self.state, self.args
        steps_per_epoch = self.planner.steps_per_epoch
        while st.step < self.total_steps and st.epoch < a.num_epochs:
            self.journal.emit(
                "epoch_begin",
                {"steps_in_epoch": steps_per_epoch, "start_step_in_epoch": st.step_in_epoch},
            )
            while st.step_in_epoch < steps_per_epoch and st.step < self.total_steps:
                outcome = self.train_step()
                if outcome is not None:
                    return outcome
            if st.step_in_epoch >= steps_per_epoch:  # the epoch is complete
                self.journal.emit("epoch_end", {"epoch": st.epoch})
                st.epoch, st.step_in_epoch = st.epoch + 1, 0
                if a.save_at_epoch_end and self.last_saved_step != st.step:
                    self.save("epoch_end")
        out = RunOutcome(**train_end("completed", st.step))
        if a.save_final and self.last_saved_step != st.step:
            self.save("final")
        return out

    def train_step(self) -> RunOutcome | None:
        """One optimizer step; returns a RunOutcome when the run must end here."""
        reset_peak_memory(self.device)  # the log's cuda_max_mem_allocated is this step's peak
        st = self.state
        t0 = time.perf_counter()
        st.step += 1
        self.profiler.step_begin(st.step)
        self.journal.emit("step_begin")
        plan = self.planner.plan(st.epoch, st.step_in_epoch)
        loss_local, tokens_local = self._forward_backward(plan)
        grad_norm = self._optimizer_step()
        paced = time.perf_counter()
        self._pace(plan)
        paced = time.perf_counter() - paced
        m = self._all_reduce(loss_local, tokens_local, grad_norm, self.inbox.poll_control())
        st.step_in_epoch += 1
        st.samples_seen += plan.global_samples
        if self.step_delay:
            time.sleep(self.step_delay)
        # training time: tok/s and the step's elapsed_time leave out rank 0's waits for the
        # callbacks and the leases (the other ranks wait for it in the all-reduce)
        elapsed = time.perf_counter() - t0 - paced
        self.step_time_s += elapsed
        applied = self.inbox.journal_control()
        self.inbox.poll_reports()
        act = decide(
            st.step, m.commands, m.interrupted, self.args, st.samples_seen, plan.global_samples
        )
        if act.log:
            self._log(plan, m, elapsed)
        if act.evaluate:
            self.evaluate()
        if act.save:
            self.save(act.save, ending=act.end)
        elif self.saver is not None:  # the background write done on every rank: journal it
            self._journal_save(self.saver.poll())
        profiled = self.profiler.step_end(st.step)  # writing the trace: a declared phase
        self.journal.emit(
            "step_end", {"loss": m.loss, **({"profile_s": profiled} if profiled else {})}
        )
        return self._ending(act.end, applied) if act.end else None

    # -- the parts of a step ---------------------------------------------------------------

    def _forward_backward(self, plan: StepPlan) -> tuple[torch.Tensor, torch.Tensor]:
        """Every micro-batch of this rank; returns its (loss sum, loss-token count)."""
        j = self.journal
        scale = self.world / max(plan.global_loss_tokens, 1)  # FSDP averages grads over ranks
        loss_acc = torch.zeros((), device=self.device)
        tokens_acc = torch.zeros((), device=self.device)
        n_micro = len(plan.micro_batches)
        for i, mb in enumerate(plan.micro_batches):
            batch = self.planner.collate(mb, self.device)
            info = {"micro_batch": i, "num_micro_batches": n_micro, "samples": len(mb)}
            hold = self.sync_last_only and i < n_micro - 1  # opt-in: reduce at the last pass
            ddp_sync: Any = contextlib.nullcontext()
            if self.ddp and hold:
                ddp_sync = cast(DistributedDataParallel, self.model).no_sync()
            with ddp_sync:
                j.emit_micro("before_forward", info)
                with torch.autocast(self.device.type, torch.bfloat16, enabled=self.autocast_bf16):
                    loss = self.model(**batch.model_kwargs())  # summed over its targets
                j.emit_micro("after_forward", info)
                if self.sync_last_only and not self.ddp:
                    cast(FSDPModule, self.model).set_requires_gradient_sync(not hold)
                j.emit_micro("before_backward", info)
                (loss * scale).backward()
                j.emit_micro("after_backward", info)
            loss_acc += loss.detach()
            tokens_acc += batch.loss_tokens
        return loss_acc, tokens_acc

    def _optimizer_step(self) -> torch.Tensor:
        """Clip, step, schedule, zero_grad; returns the (pre-clip) total grad norm."""
        self.journal.emit("before_optimizer_step")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        self.opt.step()
        if not self.precision_checked:  # the first step: grads and optimizer state exist
            log.info("precision: %s", check_fp32_master(self.model, self.opt))
            self.precision_checked = True
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        self.journal.emit("after_optimizer_step")
        return grad_norm

    def _pace(self, plan: StepPlan) -> None:
        """Rank 0, before the all-reduce: callback_pacing, and lease_pacing at a save."""
        if self.callback_pacer is not None:
            pacer = self.callback_pacer
            if pacer.wait(self.state.step, blocking=lambda: self.phases.set("callback_wait")):
                self.phases.set(None)
        st, ends = self.state, self.state.step_in_epoch + 1 >= self.planner.steps_per_epoch
        n = plan.global_samples
        if self.pacer and save_scheduled(self.args, st.step, st.samples_seen + n, n, ends):
            with self.phases("lease_wait", self.pacer.limit_s):
                self.lease_wait_s = self.pacer.wait().waited_s  # (only rank 0 journals it)

    def _all_reduce(
        self, loss: torch.Tensor, tokens: torch.Tensor, grad_norm: torch.Tensor, commands: int
    ) -> StepMetrics:
        """The step's single reduction: metrics, plus control bits and signals for free.
        Rank 0 alone contributes the bits and the (already global) grad norm."""
        is0 = 1.0 if self.rank == 0 else 0.0
        self.flags_host[0] = 1.0 if self.journal.interrupted else 0.0
        self.flags_host[1] = float(commands) * is0
        flags = self.flags_host.to(self.device, non_blocking=True)
        vec = torch.cat(
            [
                torch.stack([loss.float(), tokens.float()]),
                flags,
                (grad_norm.detach().float().to(self.device) * is0).reshape(1),
            ]
        )
        dist.all_reduce(vec)  # the host reads it once, below: the step's one sync
        loss_sum_all, tokens_all, n_interrupted, bits, gnorm = vec.tolist()
        m = StepMetrics(loss_sum_all, tokens_all, n_interrupted > 0, int(bits), gnorm)
        if m.commands:  # every rank logs it: the per-rank logs show they act at the same step
            names = "+".join(command_names(m.commands))
            log.info("control %s applied at step %d", names, self.state.step)
        return m

    def _log(self, plan: StepPlan, m: StepMetrics, elapsed: float) -> None:
        lr = self.sched.get_last_lr()[0]
        self.journal.emit(
            "log", log_payload(plan, m, elapsed, lr, self.state.samples_seen, self.device)
        )
        if self.rank == 0:
            log.info(
                "step %d/%d loss %.4f lr %.2e grad_norm %.3f %.0f tok/s",
                self.state.step,
                self.total_steps,
                m.loss,
                lr,
                m.grad_norm,
                plan.global_length / elapsed,
            )

    def _ending(self, end: EndReason, applied: list[dict[str, Any]]) -> RunOutcome:
        """The outcome of a run that ends at this boundary, by the steering policy."""
        signal = self.journal.interrupted[0] if self.journal.interrupted else None
        fields = train_end(
            end, self.state.step, signal=signal, command=ending_command(applied, end)
        )
        status, reason = fields.pop("status"), fields.pop("reason")
        final = None if end == "abort" else self._final_path()
        return RunOutcome(status, reason, final, fields)

    # -- helpers ---------------------------------------------------------------------------

    def evaluate(self) -> None:
        """The validation loss, journaled; a declared phase (no hang, however long)."""
        if self.val_planner is None:
            return
        with self.phases("eval"):
            data = validation(self.model, self.val_planner, self.device)
        self.journal.emit("evaluate", data)
        if self.rank == 0:
            val = data["val_loss"]
            log.info("step %d val_loss %.4f", self.state.step, float("nan") if val is None else val)

    def save(self, why: str, ending: EndReason | None = None) -> None:
        """Collective checkpoint; then rank 0 journals it and rotates older ones. With
        ``async_save`` the write goes on in the background and is journaled when complete.
        Its blocking part is a declared phase: no step progress meanwhile is no hang."""
        with self.phases("save"):
            self._save(why, ending)

    def _save(self, why: str, ending: EndReason | None) -> None:
        t0 = time.perf_counter()
        self.state.run_id = self.journal.run_id or self.state.run_id
        export, skipped = export_decision(self.args, self.state.step, self.total_steps, why, ending)
        writer = self.write_consolidated if export else None
        self.last_saved_step = self.state.step
        lease_wait = self.lease_wait_s if self.args.max_leased_checkpoints else None
        self.lease_wait_s = 0.0
        where = (Path(self.args.ckpt_dir), self.state, self.model, self.opt, self.sched)
        if self.saver is not None:
            waited = time.perf_counter()
            self._journal_save(self.saver.wait())  # at most one save in flight
            waited = time.perf_counter() - waited
            self.saver.start(*where, why=why, export_skipped=skipped, write_consolidated=writer)
            if self.saver.pending is not None:
                self.saver.pending.waited_s = waited
                self.saver.pending.lease_wait_s = lease_wait
            return
        path, kinds = ckpt.save_checkpoint(*where, write_consolidated=writer)
        duration = time.perf_counter() - t0
        times = {"duration": duration, "blocked_s": duration, "lease_wait_s": lease_wait}
        self._emit_save(path, kinds, why, skipped, times)

    def _journal_save(self, done: PendingSave | None) -> None:
        """Journal a completed asynchronous save at the position it captured."""
        if done is None:
            return
        if done.error is not None:  # the worker ends the run failed, in one line
            raise CheckpointWriteError(
                f"checkpoint of step {done.state.step} not saved: {done.error}"
            ) from done.exc
        times = {
            "duration": done.blocked_s + (done.background_s or 0.0),
            "blocked_s": done.blocked_s,
            "background_s": done.background_s,
            "waited_s": done.waited_s,
            "lease_wait_s": done.lease_wait_s,
            "async": True,
        }
        self.journal.follow(done.state)  # the record names the step it captured
        try:
            self._emit_save(done.final, done.kinds, done.why, done.export_skipped, times)
        finally:
            self.journal.follow(self.state)

    def _emit_save(
        self, path: Path, kinds: list[str], why: str, skipped: str | None, times: dict[str, Any]
    ) -> None:
        if times.get("lease_wait_s", 0) is None:  # no pacing: no field
            del times["lease_wait_s"]
        self.journal.emit(
            "save",
            {
                "checkpoint_path": str(path),
                "kind": kinds,
                **times,
                "trigger": why,
                "hf_path": str(path / "hf") if "hf" in kinds else None,
                "export": export_kind(self.args) if "hf" in kinds else None,
                "export_skipped": skipped,
            },
        )
        if self.rank == 0:
            log.info(
                "saved %s (%s)%s", path, why, f"; export skipped: {skipped}" if skipped else ""
            )
            with self.phases("save"):  # removing old checkpoints is part of it
                self.journal.rotate(self.args.keep_last_n)  # keeps the best (reports first)

    def _final_path(self) -> str | None:
        if self.last_saved_step != self.state.step:
            return None
        return str(checkpoints_dir(self.args.ckpt_dir) / step_dir_name(self.state.step))
