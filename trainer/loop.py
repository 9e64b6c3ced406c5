"""The distributed training loop, instrumented at every point of the callback proposal.

One optimizer step, in order (``Trainer.train_step``)::

    step_begin
    per micro-batch: before_forward, forward, after_forward, before_backward, backward, after_backward
    before_optimizer_step, clip + step + scheduler + zero_grad, after_optimizer_step
    ONE all-reduce of [loss, tokens, interrupt, control bits, grad norm]  -> the only host sync
    control records, log, evaluate, save (as due or as commanded), step_end

Control commands and signals ride in that all-reduce, so every rank acts at the same step
boundary and no collective is added for them.
"""

from __future__ import annotations

import logging
import math
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer import checkpoint as ckpt
from trainer.config import TrainingArgs
from trainer.control import ABORT, EVALUATE, LOG, SAVE, STOP, ControlPoller
from trainer.control import BITS as CONTROL_BITS
from trainer.data import StepPlanner
from trainer.emitter import Emitter
from trainer.model import loss_sum

log = logging.getLogger("trainer")


@dataclass
class Outcome:
    status: str = "completed"
    reason: str | None = None
    final_checkpoint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def warmup_cosine(warmup: int, total: int, min_ratio: float) -> Callable[[int], float]:
    """LR multiplier: linear warmup over ``warmup`` steps, then cosine down to ``min_ratio``."""

    def fn(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return fn


class Trainer:
    """Holds the training state of one rank; ``run()`` trains until done, stopped or interrupted."""

    def __init__(
        self,
        args: TrainingArgs,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        planner: StepPlanner,
        val_planner: StepPlanner | None,
        emitter: Emitter,
        poller: ControlPoller | None,
        device: torch.device,
        state: ckpt.TrainerState,
        total_steps: int,
        write_consolidated: ckpt.ConsolidatedWriter | None,
        interrupted: list[str],
    ) -> None:
        self.args, self.model, self.opt, self.sched = args, model, optimizer, scheduler
        self.planner, self.val_planner = planner, val_planner
        self.j, self.poller, self.device = emitter, poller, device
        self.state, self.total_steps, self.write_consolidated = (
            state,
            total_steps,
            write_consolidated,
        )
        self.interrupted = interrupted  # filled by the signal handler with the signal's name
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.last_saved_step = state.step if state.step else -1
        self.last_loss: float | None = None
        self.step_time_s = 0.0
        # Time in control checks (rank 0): steps with nothing new vs steps handling files.
        self.poll_idle_ns = self.poll_idle_steps = 0
        self.poll_busy_ns = self.poll_busy_steps = 0

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> Outcome:
        st, a = self.state, self.args
        steps_per_epoch = self.planner.steps_per_epoch
        while st.step < self.total_steps and st.epoch < a.num_epochs:
            self.sync_envelope()
            self.j.emit(
                "epoch_begin",
                {"steps_in_epoch": steps_per_epoch, "start_step_in_epoch": st.step_in_epoch},
            )
            while st.step_in_epoch < steps_per_epoch and st.step < self.total_steps:
                outcome = self.train_step()
                if outcome is not None:
                    return outcome
            if st.step_in_epoch >= steps_per_epoch:  # the epoch is complete
                self.j.emit("epoch_end", {"epoch": st.epoch})
                st.epoch, st.step_in_epoch = st.epoch + 1, 0
                if a.save_at_epoch_end and self.last_saved_step != st.step:
                    self.save("epoch_end")
                self.sync_envelope()
        out = Outcome("completed", f"reached step {st.step}")
        if a.save_final and self.last_saved_step != st.step:
            self.save("final")
        out.final_checkpoint = self._final_path()
        return out

    def train_step(self) -> Outcome | None:
        """One optimizer step; returns an Outcome when the run must end here."""
        st, a, j = self.state, self.args, self.j
        t0 = time.perf_counter()
        st.step += 1
        self.sync_envelope()
        j.emit("step_begin")
        plan = self.planner.plan(st.epoch, st.step_in_epoch)
        scale = self.world / max(plan.global_loss_tokens, 1)  # FSDP averages grads over ranks
        loss_acc = torch.zeros((), device=self.device)
        tokens_acc = torch.zeros((), device=self.device)
        n_micro = len(plan.micro_batches)
        for i, mb in enumerate(plan.micro_batches):
            ids, labels = self.planner.collate(mb, self.device)
            info = {"micro_batch": i, "num_micro_batches": n_micro, "samples": len(mb)}
            j.emit_micro("before_forward", info)
            loss, n_tok = loss_sum(_logits(self.model(ids)), labels)
            j.emit_micro("after_forward", info)
            if hasattr(self.model, "set_requires_gradient_sync"):  # reduce grads once, at the end
                self.model.set_requires_gradient_sync(i == n_micro - 1)
            j.emit_micro("before_backward", info)
            (loss * scale).backward()
            j.emit_micro("after_backward", info)
            loss_acc += loss.detach()
            tokens_acc += n_tok
        j.emit("before_optimizer_step")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), a.max_grad_norm)
        if isinstance(grad_norm, DTensor):
            grad_norm = grad_norm.full_tensor()
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        j.emit("after_optimizer_step")

        # The step's single reduction: metrics, plus control bits and signals for free.
        mask = 0
        if self.poller is not None:
            looked = self.poller.changed
            t_poll = time.perf_counter_ns()
            mask = self.poller.poll()
            dt = time.perf_counter_ns() - t_poll
            if looked:
                self.poll_busy_ns += dt
                self.poll_busy_steps += 1
            else:
                self.poll_idle_ns += dt
                self.poll_idle_steps += 1
        is0 = 1.0 if self.rank == 0 else 0.0
        vec = torch.stack(
            [
                loss_acc.float(),
                tokens_acc.float(),
                torch.tensor(1.0 if self.interrupted else 0.0, device=self.device),
                torch.tensor(float(mask) * is0, device=self.device),
                grad_norm.detach().float().to(self.device) * is0,
            ]
        )
        dist.all_reduce(vec)
        loss_sum_all, tokens_all, n_interrupted, mask_f, gnorm = vec.tolist()
        mask = int(mask_f)
        if mask:  # every rank logs it: the per-rank logs show they act at the same step
            log.info(
                "control %s applied at step %d",
                "+".join(n for n, b in CONTROL_BITS.items() if mask & b),
                st.step,
            )
        st.step_in_epoch += 1
        st.samples_seen += plan.global_samples
        if a.step_delay:
            time.sleep(a.step_delay)
        elapsed = time.perf_counter() - t0
        self.step_time_s += elapsed
        self.sync_envelope()
        loss_avg = loss_sum_all / tokens_all if tokens_all else float("nan")
        self.last_loss = loss_avg
        commands = self._journal_control(mask)

        if st.step % a.log_every == 0 or mask & LOG:
            j.emit(
                "log",
                {
                    "loss": loss_avg,
                    "loss_finite": math.isfinite(loss_avg),
                    "lr": self.sched.get_last_lr()[0],
                    "grad_norm": gnorm,
                    "elapsed_time": elapsed,
                    "tokens_per_s": plan.global_length / elapsed,
                    "samples_per_s": plan.global_samples / elapsed,
                    "samples_seen": st.samples_seen,
                    "batch_metrics": {
                        "total_samples": plan.global_samples,
                        "total_length": plan.global_length,
                        "num_loss_counted_tokens": int(tokens_all),
                        "accumulated_loss": loss_sum_all,
                        "grad_accum_steps": n_micro,
                        "num_minibatches": n_micro,
                    },
                    "cuda_mem_allocated": torch.cuda.memory_allocated()
                    if self.device.type == "cuda"
                    else None,
                },
            )
            if self.rank == 0:
                log.info(
                    "step %d/%d loss %.4f lr %.2e grad_norm %.3f %.0f tok/s",
                    st.step,
                    self.total_steps,
                    loss_avg,
                    self.sched.get_last_lr()[0],
                    gnorm,
                    plan.global_length / elapsed,
                )
        if (a.eval_every and st.step % a.eval_every == 0) or mask & EVALUATE:
            self.evaluate()
        stop_reason = None
        if mask & ABORT:
            stop_reason = "abort"
        elif mask & STOP:
            stop_reason = "stop"
        elif n_interrupted:
            stop_reason = "interrupt"
        due = bool(a.save_every and st.step % a.save_every == 0)
        if stop_reason != "abort" and (due or mask & SAVE or stop_reason):
            self.save(
                "control" if mask & (SAVE | STOP) else "interrupt" if n_interrupted else "interval"
            )
        j.emit("step_end", {"loss": loss_avg})
        if stop_reason is None:
            return None
        if stop_reason == "interrupt":
            sig = self.interrupted[0] if self.interrupted else "signal on another rank"
            return Outcome("interrupted", f"{sig} at step {st.step}", self._final_path())
        cmd = next((c for c in commands if c["command"] == stop_reason), {})
        why = f"{stop_reason} command" + (f": {cmd['reason']}" if cmd.get("reason") else "")
        return Outcome(
            "stopped",
            why,
            None if stop_reason == "abort" else self._final_path(),
            {"command": stop_reason, "command_id": cmd.get("id")},
        )

    # -- helpers ---------------------------------------------------------------------------

    def sync_envelope(self) -> None:
        self.j.step, self.j.epoch, self.j.samples_seen = (
            self.state.step,
            self.state.epoch,
            self.state.samples_seen,
        )

    def _journal_control(self, mask: int) -> list[dict[str, Any]]:
        """Journal the commands carried by this step's reduce, and any rejections."""
        if self.poller is None:
            return []
        out = []
        for rej in self.poller.take_rejected():
            self.j.emit(
                "control",
                {
                    "command": rej.command,
                    "id": rej.id,
                    "source": rej.source,
                    "accepted": False,
                    "reason": rej.reason,
                    "applied_at_step": None,
                },
            )
        for cmd in self.poller.take_applied():
            rec = {
                "command": cmd.command,
                "id": cmd.id,
                "source": cmd.source,
                "accepted": True,
                "reason": cmd.reason,
                "applied_at_step": self.state.step,
            }
            self.j.emit("control", rec)
            out.append(rec)
        return out

    @torch.no_grad()
    def evaluate(self) -> None:
        if self.val_planner is None:
            return
        t0 = time.perf_counter()
        self.model.eval()
        plan = self.val_planner.plan_indices(list(range(len(self.val_planner.samples))))
        acc = torch.zeros(2, device=self.device)
        for mb in plan.micro_batches:
            ids, labels = self.val_planner.collate(mb, self.device)
            loss, n_tok = loss_sum(_logits(self.model(ids)), labels)
            acc += torch.stack([loss.float(), n_tok.float()])
        dist.all_reduce(acc)
        self.model.train()
        total, n = acc.tolist()
        val_loss = total / n if n else None
        self.j.emit(
            "evaluate",
            {"val_loss": val_loss, "val_num_tokens": int(n), "duration": time.perf_counter() - t0},
        )
        if self.rank == 0:
            log.info(
                "step %d val_loss %.4f",
                self.state.step,
                val_loss if val_loss is not None else float("nan"),
            )

    def save(self, why: str) -> None:
        t0 = time.perf_counter()
        self.state.run_id = self.j.writer.run_id if self.j.writer else self.state.run_id
        path, kinds = ckpt.save_checkpoint(
            Path(self.args.ckpt_dir),
            self.state,
            self.model,
            self.opt,
            self.sched,
            write_consolidated=self.write_consolidated if self.args.save_hf else None,
            keep_last_n=self.args.keep_last_n,
        )
        self.last_saved_step = self.state.step
        self.j.emit(
            "save",
            {
                "checkpoint_path": str(path),
                "kind": kinds,
                "duration": time.perf_counter() - t0,
                "trigger": why,
                "hf_path": str(path / "hf") if "hf" in kinds else None,
            },
        )
        if self.rank == 0:
            log.info("saved %s (%s)", path, why)

    def _final_path(self) -> str | None:
        if self.last_saved_step != self.state.step:
            return None
        return str(ckpt.checkpoints_root(Path(self.args.ckpt_dir)) / f"step-{self.state.step:06d}")


def _logits(out: Any) -> torch.Tensor:
    return out.logits if hasattr(out, "logits") else out


def failure_payload(exc: BaseException) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return {
        "status": "failed",
        "reason": f"{type(exc).__name__}: {exc}",
        "final_checkpoint": None,
        "error_type": type(exc).__name__,
        "error_message": str(exc),
        "traceback": "\n".join(tb.strip().splitlines()[-25:]),
    }
