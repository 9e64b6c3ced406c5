"""What every bridge shares: the journal of a run written by the main process, the control
channel agreed on by every rank, and a ``train_end`` on every exit.

A :class:`JournalSession` is opened on every rank (the others write nothing), so that the
per-step agreement on control commands is one collective that all ranks take part in.
"""

from __future__ import annotations

import contextlib
import os
import platform
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from journal.lock import JournalLock
from journal.reader import iter_events, last_record
from journal.writer import JournalWriter
from trainer.control_poller import BITS, ControlPoller
from trainer.emitter import Emitter, failure_payload


class JournalSession:
    """One run's journal and control channel, on one rank.

    Args:
        ckpt_dir: where ``journal.jsonl``, ``control/`` and ``reports/`` live.
        main: whether this rank writes (the main process).
        device: where the agreement tensor lives (the backend's device).
        role: who writes, for ``ilab-journal status`` (e.g. ``hf-trainer``).
    """

    def __init__(
        self, ckpt_dir: str | os.PathLike[str], *, main: bool, device: torch.device, role: str
    ) -> None:
        self.dir = Path(ckpt_dir)
        self.main, self.device, self.role = main, device, role
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self.j = Emitter(None, "step")
        self.poller: ControlPoller | None = None
        self.lock: JournalLock | None = None
        self.ended = False
        self.interrupted: list[str] = []  # signals seen on this rank
        self.interrupted_anywhere = False  # ... on any rank, as of the last agreement
        self.agree_ns = self.poll_ns = self.steps = 0
        self.t0 = time.perf_counter()

    def open(self, *, resume: bool = False) -> None:
        """Main process: take the journal lock, open the writer and the control channel.
        Every rank: install SIGTERM/SIGINT handlers (a signal stops at the next step)."""
        with contextlib.suppress(ValueError):  # not the main thread: leave handlers alone
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
        if not self.main:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock = JournalLock(self.dir, role=self.role)
        self.lock.acquire(timeout=60)
        jpath = self.dir / "journal.jsonl"
        last = last_record(jpath) if jpath.exists() else None
        resumed = last is not None and (last.get("event") != "train_end" or resume)
        self.j = Emitter(JournalWriter(self.dir, resume=resumed), "step")
        seen = {
            r["data"]["id"]
            for r in (iter_events(jpath, {"control"}) if jpath.exists() else ())
            if isinstance(r["data"].get("id"), str)
        }
        self.poller = ControlPoller(self.dir, seen, not_before=time.time())
        self.poller.start()
        sys.excepthook = self._excepthook(sys.excepthook)
        self.t0 = time.perf_counter()

    def begin(self, config: dict[str, Any], total_steps: int | None, **extra: Any) -> None:
        """The ``train_begin`` record."""
        self.j.emit(
            "train_begin",
            {
                "config": jsonable(config),
                "world_size": self.world,
                "nnodes": max(1, self.world // int(os.environ.get("LOCAL_WORLD_SIZE", self.world))),
                "device_type": self.device.type,
                "journal_detail": "step",
                "resumed_from": None,
                "total_steps": total_steps if total_steps is not None else 0,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "versions": {"python": platform.python_version(), "torch": torch.__version__},
                **extra,
            },
        )

    def at(self, step: int, epoch: int = 0) -> None:
        """Set the envelope's position for the records that follow."""
        self.j.step, self.j.epoch = step, epoch

    def agree(self) -> tuple[int, list[dict[str, Any]]]:
        """Every rank, once per step: the command bits the main process read (and whether a
        signal arrived on any rank), in one all_reduce; the main process journals the
        commands as ``control`` records. Returns (bits, the applied commands)."""
        self.steps += 1
        t = time.perf_counter_ns()
        bits = self.poller.poll() if self.poller is not None else 0
        self.poll_ns += time.perf_counter_ns() - t
        self.interrupted_anywhere = bool(self.interrupted)
        if self.world > 1:
            t = time.perf_counter_ns()
            vec = torch.tensor([float(bits), 1.0 if self.interrupted else 0.0], device=self.device)
            dist.all_reduce(vec)
            bits_all, signals = vec.tolist()
            self.agree_ns += time.perf_counter_ns() - t
            bits, self.interrupted_anywhere = int(bits_all), signals > 0
        return bits, self._journal_control()

    def _journal_control(self) -> list[dict[str, Any]]:
        """The main process: the commands of this agreement as ``control`` records."""
        return self.poller.journal(self.j.emit, self.j.step) if self.poller is not None else []

    def end(self, payload: dict[str, Any]) -> None:
        """The ``train_end`` record (once), with the bridge's measured cost; then close."""
        if self.ended:
            return
        self.ended = True
        self.j.emit("train_end", {**payload, "journal": self.cost()})
        self.j.close()
        if self.poller is not None:
            self.poller.close()
        if self.lock is not None and self.lock.held:
            self.lock.release()

    def cost(self) -> dict[str, Any]:
        """Time inside the bridge, measured directly on this rank: journal appends, control
        checks and the per-step agreement, against the training wall time."""
        wall = time.perf_counter() - self.t0
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

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if not self.interrupted:
            self.interrupted.append(signal.Signals(signum).name)

    def _excepthook(self, previous: Any) -> Any:
        """An exception nobody caught ends the journal as ``failed`` (trainers call no
        hook then), then the previous hook prints it as usual."""

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            with contextlib.suppress(Exception):
                self.end(failure_payload(exc))
            previous(kind, exc, tb)

        return hook


def command_names(bits: int) -> list[str]:
    """The command names in a bit mask, in a fixed order."""
    return [name for name, bit in BITS.items() if bits & bit]


def jsonable(value: Any) -> Any:
    """Configs hold enums and paths: keep what JSON can say."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)
