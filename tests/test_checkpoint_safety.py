"""Checkpoint files are loaded as data, never as code (issue 18, item 2): a pickle planted in
``scheduler.pt``, ``rng_rank*.pt``, DCP's ``.metadata`` or a DCP value does not run on
resume; it is refused with one line naming the file. Checkpoints of the previous format
(``scheduler.pt``) still resume."""

from __future__ import annotations

import io
import pickle
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.helpers import records, train
from trainer.checkpoint.files import (
    LEGACY_SCHEDULER_FILE,
    SCHEDULER_FILE,
    CheckpointError,
    SafeLoadPlanner,
    SafeReader,
    read_rng_state,
    read_scheduler_state,
)
from trainer.checkpoint.sharded import _rng_state
from trainer.model.optim import warmup_cosine


class Payload:
    """Unpickling this creates ``marker``: what `id` run as root stands for."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.marker, "w"))


def _plant_torch(path: Path, marker: Path, key: str = "cpu") -> None:
    torch.save({key: Payload(marker)}, path)


def test_the_planted_payload_is_live(tmp_path: Path) -> None:
    """The payload the tests plant does run under a plain unpickler (so "no marker" below
    means it was refused, not that it was harmless)."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker))).close()
    assert marker.exists()


def test_planted_scheduler_and_rng_files_are_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    full = tmp_path / "full_state"
    full.mkdir()
    _plant_torch(full / LEGACY_SCHEDULER_FILE, marker, key="base_lrs")  # an old-format ckpt
    _plant_torch(full / "rng_rank0.pt", marker)
    with pytest.raises(
        CheckpointError, match=r"scheduler\.pt: refusing to load it: it holds io\.open"
    ):
        read_scheduler_state(full)
    with pytest.raises(CheckpointError, match=r"rng_rank0\.pt: refusing to load it"):
        read_rng_state(full / "rng_rank0.pt")
    assert not marker.exists()


def _dcp_checkpoint(path: Path) -> dict[str, Any]:
    state = {
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
        "optim": {"lr": 0.1, "betas": (0.9, 0.99), "params": ["w"]},
    }
    dcp.save(state, checkpoint_id=str(path))
    return state


def _empty() -> dict[str, Any]:
    return {"model": {"w": torch.zeros(2, 3)}, "optim": {"lr": 0.0, "betas": (0, 0), "params": []}}


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_dcp_checkpoints_load_through_the_safe_reader_and_planner(tmp_path: Path) -> None:
    saved = _dcp_checkpoint(tmp_path)
    out = _empty()
    dcp.load(out, storage_reader=SafeReader(tmp_path), planner=SafeLoadPlanner(tmp_path))
    assert torch.equal(out["model"]["w"], saved["model"]["w"])
    assert out["optim"] == saved["optim"]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_planted_dcp_metadata_or_value_is_refused_and_never_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ckpt = tmp_path / "ckpt"
    _dcp_checkpoint(ckpt)
    (ckpt / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    reader = SafeReader(ckpt)
    with pytest.raises(CheckpointError, match=r"\.metadata: refusing to load it: .*open"):
        reader.read_metadata()
    # A DCP value (the optimizer's lr, betas, ...) is a torch.save'd object in a shard.
    planner = SafeLoadPlanner(ckpt)
    buf = io.BytesIO()
    torch.save(Payload(marker), buf)
    buf.seek(0)
    item: Any = type("Item", (), {"dest_index": type("Index", (), {"fqn": "optim.lr"})()})()
    with pytest.raises(CheckpointError, match=r"ckpt: refusing to load it: .*\(in optim\.lr\)"):
        planner.load_bytes(item, buf)
    assert not marker.exists()


def test_checkpoints_of_the_previous_format_still_load(tmp_path: Path) -> None:
    """Before: scheduler.pt (torch.save of the state dict) and rng_rank<r>.pt of tensors,
    both plain data, so weights_only reads them."""
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(2, 10, 0.1))
    for _ in range(3):
        opt.step()
        sched.step()
    torch.save(sched.state_dict(), tmp_path / LEGACY_SCHEDULER_FILE)
    torch.save(_rng_state(), tmp_path / "rng_rank0.pt")
    assert read_scheduler_state(tmp_path) == sched.state_dict()
    assert torch.equal(read_rng_state(tmp_path / "rng_rank0.pt")["cpu"], torch.get_rng_state())
    fresh = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine(2, 10, 0.1))
    fresh.load_state_dict(read_scheduler_state(tmp_path))
    assert fresh.get_last_lr() == sched.get_last_lr()


@pytest.mark.extended
@pytest.mark.dist
def test_a_resume_from_a_checkpoint_with_planted_pickles_runs_nothing(tmp_path: Path) -> None:
    """A real 2-rank run, then its checkpoint's RNG files replaced by pickles; the resume
    refuses them with one line naming the file, and the payload never runs."""
    run = tmp_path / "run"
    first = train(run, "--max-steps", "2", "--save-every", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    full = run / "checkpoints" / "step-000002" / "full_state"
    assert (full / SCHEDULER_FILE).exists() and not (full / LEGACY_SCHEDULER_FILE).exists()
    marker = tmp_path / "ran"
    for rank in (0, 1):
        _plant_torch(full / f"rng_rank{rank}.pt", marker)
    proc = train(run, "--max-steps", "4")
    assert proc.returncode == 1, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("ilab-train: training failed: CheckpointError: ")
    assert "rng_rank" in last and "refusing to load it" in last
    assert not marker.exists()
    end = records(run)[-1]
    assert end["event"] == "train_end" and end["data"]["error_type"] == "CheckpointError"
    # DCP's .metadata is read inside its collective load, which wraps what fails there in
    # a CheckpointException (a BaseException): the refusal still comes out as one line.
    (full / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    proc = train(run, "--max-steps", "4")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and ".metadata: refusing to load it" in last, proc.stderr[-2000:]
    assert not marker.exists()
    shutil.rmtree(run)


@pytest.mark.extended
@pytest.mark.dist
def test_a_newest_checkpoint_that_cannot_be_loaded_falls_back_to_the_one_before(
    tmp_path: Path,
) -> None:
    """A real 2-rank run saved steps 2 and 4, then step 4's shards were cut short on disk
    (complete by its markers): the resume says in one line that step 4 cannot be loaded
    and resumes from step 2, the newest complete checkpoint before it (it failed on every
    relaunch before)."""
    run = tmp_path / "run"
    first = train(run, "--max-steps", "4", "--save-every", "2")
    assert first.returncode == 0, first.stderr[-2000:]
    newest = run / "checkpoints" / "step-000004"
    for shard in (newest / "full_state").glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:100])
    proc = train(run, "--max-steps", "6", "--save-every", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = max((run / "logs").glob("launch-*.log")).read_text()  # the console's, --quiet
    [line] = [x for x in log.splitlines() if f"cannot load {newest} (RuntimeError: " in x]
    assert line.endswith(
        f"resuming from {run / 'checkpoints' / 'step-000002'}, the newest complete checkpoint before it"
    ), line
    begin = [r for r in records(run) if r["event"] == "train_begin"][-1]
    assert begin["attempt"] == 2 and begin["data"]["resumed_from"].endswith("step-000002")
    steps = [r["step"] for r in records(run) if r["event"] == "step_end" and r["attempt"] == 2]
    assert steps == [3, 4, 5, 6]
