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
applied through ``TrainerControl`` at the same step everywhere: ``stop`` saves and stops,
``abort`` stops without saving. Each is journaled as a ``control`` record.

Not covered yet: leases (HF's ``save_total_limit`` rotation does not know them) and reports
folded into ``keep_best``.
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
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from journal.lock import JournalLock
from journal.reader import iter_events, last_record
from journal.writer import JournalWriter
from trainer.control_poller import ABORT, EVALUATE, LOG, SAVE, STOP, ControlPoller
from trainer.emitter import Emitter

log = logging.getLogger(__name__)


class JournalCallback(TrainerCallback):
    """Journals an HF Trainer run and applies control commands (see the module docstring).

    Args:
        ckpt_dir: where the journal, ``control/`` and ``reports/`` live; default
            ``args.output_dir`` (where HF writes ``checkpoint-N``).
        journal_detail: ``step`` (every event) or ``off``.
    """

    def __init__(
        self, ckpt_dir: str | os.PathLike[str] | None = None, journal_detail: str = "step"
    ) -> None:
        self.ckpt_dir = Path(ckpt_dir) if ckpt_dir is not None else None
        self.detail = journal_detail
        self.j = Emitter(None, journal_detail)
        self.poller: ControlPoller | None = None
        self.lock: JournalLock | None = None
        self.ended = False
        self.interrupted: list[str] = []
        self.abort = False
        self.step_t0 = time.perf_counter()
        self.agree_ns = 0  # time inside the per-step agreement
        self.poll_ns = 0  # time reading the control dir (main process)
        self.steps = 0
        self.train_t0 = time.perf_counter()

    # -- start and end -----------------------------------------------------------------

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.dir = Path(self.ckpt_dir or args.output_dir)
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.device = torch.device(args.device)
        self._install_signal_handlers()
        if not state.is_world_process_zero or self.detail == "off":
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = JournalLock(self.dir, role="hf-trainer")
        self.lock.acquire(timeout=60)
        jpath = self.dir / "journal.jsonl"
        last = last_record(jpath) if jpath.exists() else None
        resumed = last is not None and (
            last.get("event") != "train_end" or bool(kw.get("resume_from_checkpoint"))
        )
        self.j = Emitter(JournalWriter(self.dir, resume=resumed), self.detail)
        seen = {
            r["data"]["id"]
            for r in (iter_events(jpath, {"control"}) if jpath.exists() else ())
            if isinstance(r["data"].get("id"), str)
        }
        self.train_t0 = time.perf_counter()
        self.poller = ControlPoller(self.dir, seen, not_before=time.time())
        self.poller.start()
        sys.excepthook = self._excepthook(sys.excepthook)
        self._sync(state)
        self.j.emit(
            "train_begin",
            {
                "config": _jsonable(args.to_dict()),
                "world_size": self.world,
                "nnodes": max(1, self.world // int(os.environ.get("LOCAL_WORLD_SIZE", self.world))),
                "device_type": self.device.type,
                "journal_detail": "step",
                "resumed_from": None,
                "total_steps": state.max_steps,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "versions": {"python": platform.python_version(), "torch": torch.__version__},
                "trainer": "transformers.Trainer",
            },
        )

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._sync(state)
        if self.interrupted:
            status, reason = "interrupted", f"{self.interrupted[0]} at step {state.global_step}"
        elif self.abort or (state.global_step < state.max_steps and control.should_training_stop):
            status, reason = "stopped", f"stopped at step {state.global_step}"
        else:
            status, reason = "completed", f"reached step {state.global_step}"
        self._end(
            {
                "status": status,
                "reason": reason,
                "final_checkpoint": self._last_ckpt(args, state),
                "journal": self._cost(),
            }
        )

    def _cost(self) -> dict[str, Any]:
        """Time inside this callback, directly measured (main process): journal appends,
        control-dir checks and the per-step agreement, against the training wall time."""
        wall = time.perf_counter() - self.train_t0
        own = self.j.append_ns + self.poll_ns + self.agree_ns
        steps = max(self.steps, 1)
        return {
            "records": self.j.appends,
            "append_ns_per_step": self.j.append_ns / steps,
            "control_ns_per_step": self.poll_ns / steps,
            "agree_ns_per_step": self.agree_ns / steps,
            "train_wall_s": wall,
            "overhead_fraction": own / 1e9 / wall if wall > 0 else None,
        }

    def _end(self, payload: dict[str, Any]) -> None:
        if self.ended:
            return
        self.ended = True
        self.j.emit("train_end", payload)
        self.j.close()
        if self.poller is not None:
            self.poller.close()
        if self.lock is not None and self.lock.held:
            self.lock.release()

    def _excepthook(self, previous: Any) -> Any:
        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            text = "".join(traceback.format_exception(kind, exc, tb))
            first = (str(exc).strip().splitlines() or [""])[0]
            with contextlib.suppress(Exception):
                self._end(
                    {
                        "status": "failed",
                        "reason": f"{kind.__name__}: {first}",
                        "error_type": kind.__name__,
                        "error_message": str(exc)[:2000],
                        "traceback": "\n".join(text.strip().splitlines()[-25:]),
                        "final_checkpoint": None,
                    }
                )
            previous(kind, exc, tb)

        return hook

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, _frame: Any) -> None:
            if not self.interrupted:
                self.interrupted.append(signal.Signals(signum).name)

        with contextlib.suppress(ValueError):  # not the main thread: leave them alone
            signal.signal(signal.SIGTERM, handler)
            signal.signal(signal.SIGINT, handler)

    # -- the step ------------------------------------------------------------------------

    def on_epoch_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._sync(state)
        self.j.emit("epoch_begin", {})

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._sync(state)
        self.j.emit("epoch_end", {"epoch": int(state.epoch or 0)})

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.step_t0 = time.perf_counter()
        self._sync(state, step=state.global_step + 1)
        self.j.emit("step_begin")

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.j.emit("before_optimizer_step")

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self.j.emit("after_optimizer_step")

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._sync(state)
        t = time.perf_counter_ns()
        mine = self.poller.poll() if self.poller is not None else 0
        self.poll_ns += time.perf_counter_ns() - t
        bits = self._agree(mine)
        applied = self._journal_control(state)
        if bits & ABORT:
            self.abort = True
            control.should_training_stop = True
            control.should_save = False
        elif bits & STOP or self.interrupted_anywhere:
            control.should_training_stop = True
            control.should_save = True
        if not self.abort:
            if bits & SAVE:
                control.should_save = True
            if bits & EVALUATE:
                control.should_evaluate = True
        if bits & LOG:
            control.should_log = True
        if applied and state.is_world_process_zero:
            log.info(
                "control %s applied at step %d",
                "+".join(c["command"] for c in applied),
                state.global_step,
            )
        self.j.emit("step_end", {})

    def _agree(self, bits: int) -> int:
        """Every rank: the main process's command bits and whether a signal arrived on any
        rank, in one all_reduce (the per-step cost of same-step control)."""
        self.steps += 1
        self.interrupted_anywhere = bool(self.interrupted)
        if self.world == 1:
            return bits
        t = time.perf_counter_ns()
        vec = torch.tensor([float(bits), 1.0 if self.interrupted else 0.0], device=self.device)
        dist.all_reduce(vec)
        bits_all, signals = vec.tolist()
        self.agree_ns += time.perf_counter_ns() - t
        self.interrupted_anywhere = signals > 0
        return int(bits_all)

    def _journal_control(self, state: Any) -> list[dict[str, Any]]:
        if self.poller is None:
            return []
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
        out = []
        for cmd in self.poller.take_applied():
            rec = {
                "command": cmd.command,
                "id": cmd.id,
                "source": cmd.source,
                "accepted": True,
                "reason": cmd.reason,
                "applied_at_step": state.global_step,
            }
            self.j.emit("control", rec)
            out.append(rec)
        return out

    # -- metrics and checkpoints ----------------------------------------------------------

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        logs = dict(logs or {})
        if "loss" not in logs:  # the end-of-training summary and eval logs go elsewhere
            return
        self._sync(state)
        elapsed = time.perf_counter() - self.step_t0
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * self.world
        self.j.emit(
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
        self._sync(state)
        self.j.emit(
            "evaluate",
            {
                **{k: v for k, v in metrics.items() if isinstance(v, (int, float))},
                "val_loss": metrics.get("eval_loss"),
                "duration": metrics.get("eval_runtime"),
            },
        )

    def on_save(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._sync(state)
        path = self._ckpt_path(args, state)
        self.j.emit(
            "save",
            {
                "checkpoint_path": str(path),
                "kind": ["hf"],
                "hf_path": str(path),
                "duration": None,
                "trigger": "hf",
            },
        )

    # -- helpers ---------------------------------------------------------------------------

    def _sync(self, state: Any, step: int | None = None) -> None:
        self.j.step = state.global_step if step is None else step
        self.j.epoch = int(state.epoch or 0)

    @staticmethod
    def _ckpt_path(args: Any, state: Any) -> Path:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        return Path(args.output_dir).resolve() / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"

    def _last_ckpt(self, args: Any, state: Any) -> str | None:
        path = self._ckpt_path(args, state)
        return str(path) if path.is_dir() else None


def _jsonable(value: Any) -> Any:
    """TrainingArguments.to_dict() holds enums and paths: keep what JSON can say."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
