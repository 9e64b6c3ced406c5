"""Asynchronous checkpoints: training blocks only while the state is staged to host memory
(pinned on CUDA, and reused from one save to the next).

The sharded state is written by DCP in a background thread, on a gloo process group of its
own (never a communicator that training uses). The small files (scheduler, trainer state,
RNG) are written while training waits. A consolidated model, when one is due, is made from
the written shards by rank 0's export thread (:mod:`trainer.checkpoint.export`): no rank gathers the
model or waits for rank 0 to write it. The checkpoint stays under ``.tmp-step-N`` until
every rank's write is done; then rank 0 renames it into place (export included), and only
then does the caller journal the ``save``. So a ``kill -9`` while a write is in flight
leaves only a ``.tmp-`` directory, which readers, watchers, rotation and resume ignore, and
the next save removes.

At most one save is in flight: the next save waits for it (and that wait is measured).
Completion is agreed at step boundaries over a second gloo group (one tiny all-reduce per
step while a write is in flight), so every rank sees the same completed save at the same step.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.state_dict import get_state_dict

from trainer.checkpoint.export import export_from_shards
from trainer.checkpoint.sharded import TrainerState, prepare_tmp, put_in_place, write_small_files
from trainer.model.spec import ConsolidatedWriter

log = logging.getLogger(__name__)

#: Test-only: seconds a background write takes longer, so tests can kill while one is in flight.
WRITE_DELAY_ENV = "ILAB_TEST_WRITE_DELAY"


class CheckpointWriteError(RuntimeError):
    """A background checkpoint write failed (on this rank or another); the run ends failed
    with the previous checkpoints intact."""


@dataclass
class PendingSave:
    """One checkpoint captured at ``state.step`` whose sharded state may still be written."""

    state: TrainerState  # the position captured (the save record carries it)
    tmp: Path
    final: Path
    kinds: list[str]
    why: str
    export_skipped: str | None
    blocked_s: float  # training waited this long (staging + small files)
    started: float  # perf_counter when the background write began
    future: Any
    background_s: float | None = None
    error: str | None = None  # set when the write failed on some rank
    exc: BaseException | None = None  # this rank's exception, when it failed here
    waited_s: float = 0.0  # how long this save waited for the previous one
    lease_wait_s: float | None = None  # how long it waited for leases (lease_pacing)


class HostStager(AsyncStager):
    """Stages a state dict into host memory that is kept from one save to the next (pinned
    on CUDA, filled by non-blocking copies), for the whole run.

    DCP's ``DefaultStager`` does this in torch 2.9 and 2.13, but torch 2.11's drops its host
    copies and its copy table after every save, and the next save with it fails (``KeyError:
    <class 'type'>``; a torch regression). The ``StateDictStager`` that it wraps, kept open
    here, behaves alike on every version. Staging is synchronous: :meth:`stage` returns once the
    copies are complete, so training may change the parameters right after it.
    """

    _synchronize_after_execute = False  # nothing left to wait for once stage() returns

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self._stager = StateDictStager(pin_memory=cuda, share_memory=False)

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """Host copies of ``state_dict`` (the same buffers as the previous save's)."""
        staged: dict[str, Any] = self._stager.stage(state_dict, non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.synchronize()  # the non-blocking device-to-host copies have landed
        return staged

    def synchronize_staging(self) -> None:
        """Nothing to wait for: :meth:`stage` is synchronous."""

    def close(self) -> None:
        """Release the host copies (and their pinning)."""
        self._stager.close()


class AsyncCheckpointer:
    """Collective: every rank makes one (after the default process group) and calls its
    methods at the same points."""

    def __init__(self) -> None:
        # Two groups: the writer's collectives run in a background thread, so the completion
        # vote needs its own group (two threads must never share one).
        self.write_group = dist.new_group(backend="gloo")
        self.vote_group = dist.new_group(backend="gloo")
        self.pending: PendingSave | None = None
        # One stager for the whole run (HostStager): reusing its host copies is safe because
        # the next save starts only once this one is written.
        self.stager = HostStager(cuda=torch.cuda.is_available())
        # rank 0's export thread: started by its first export (ThreadPoolExecutor is lazy)
        self.exporter = ThreadPoolExecutor(1, thread_name_prefix="ilab-export")
        self.write_delay = float(os.environ.get(WRITE_DELAY_ENV) or 0)

    def start(
        self,
        ckpt_dir: Path,
        state: TrainerState,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any,
        *,
        why: str,
        export_skipped: str | None,
        write_consolidated: ConsolidatedWriter | None,
    ) -> None:
        """Stage the state and start its write; returns once training may go on. The caller
        has waited for the previous save (:meth:`wait`)."""
        assert self.pending is None, "wait for the save in flight first"
        t0 = time.perf_counter()
        tmp, final = prepare_tmp(ckpt_dir, state.step)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        written = dcp.async_save(
            {"model": model_sd, "optim": optim_sd},
            checkpoint_id=str(tmp / "full_state"),
            process_group=self.write_group,
            async_stager=self.stager,
        )
        # a synchronous stager: the upload's future, not a staging response
        assert isinstance(written, Future)
        future: Future[Any] = written
        write_small_files(tmp, state, scheduler)
        kinds = ["full_state"] + (["hf"] if write_consolidated is not None else [])
        if dist.get_rank() == 0 and (write_consolidated is not None or self.write_delay):
            # the export from the shards, once every rank has written them
            future = self.exporter.submit(
                _finish_write, future, tmp, write_consolidated, self.write_delay
            )
        blocked = time.perf_counter() - t0
        self.pending = PendingSave(
            replace(state), tmp, final, kinds, why, export_skipped, blocked, t0, future
        )

    def poll(self) -> PendingSave | None:
        """Collective, at a step boundary: the save in flight if every rank finished writing
        it (now renamed into place), else None."""
        if self.pending is None:
            return None
        done = torch.tensor([1 if self.pending.future.done() else 0])
        dist.all_reduce(done, op=dist.ReduceOp.MIN, group=self.vote_group)
        return self._finish() if int(done.item()) else None

    def wait(self) -> PendingSave | None:
        """Collective: block until the save in flight is written and in place; returns it."""
        return self._finish() if self.pending is not None else None

    def _finish(self) -> PendingSave:
        p, self.pending = self.pending, None
        assert p is not None
        failed = torch.tensor([0])
        try:
            p.future.result()
        except Exception as exc:  # a full disk, most often: the caller reports it
            p.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            p.exc = exc
            failed[0] = 1
        dist.all_reduce(failed, op=dist.ReduceOp.MAX, group=self.vote_group)
        p.background_s = time.perf_counter() - p.started - p.blocked_s
        if int(failed.item()) and p.error is None:
            p.error = "the checkpoint write failed on another rank"
        if dist.get_rank() == 0:
            if p.error is None:
                put_in_place(p.tmp, p.final, p.state.run_id)
            else:
                shutil.rmtree(p.tmp, ignore_errors=True)  # the previous checkpoints stay
        dist.barrier(group=self.vote_group)  # renamed before any rank reports it
        return p


def _finish_write(
    written: Future[Any], tmp: Path, write: ConsolidatedWriter | None, delay: float
) -> None:
    """Rank 0's part of a background save after the shards: once they are complete on every
    rank (DCP's future on the coordinator ends after the metadata, which comes after every
    rank's write), read the model back from them and write ``tmp/hf`` when an export is due."""
    written.result()
    if write is not None:
        export_from_shards(tmp, write)
    time.sleep(delay)  # test-only (WRITE_DELAY_ENV): widens the window a kill may land in
