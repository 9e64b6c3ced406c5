"""A resume with other model settings is one line naming the first difference, never a
DCP traceback and never a silent partial load (fewer layers loaded what matched)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    TensorProperties,
    TensorStorageMetadata,
)

from tests.helpers import records, train
from trainer.checkpoint.fit import CheckpointMismatch, model_misfit


def _saved(**shapes: tuple[int, ...]) -> dict[str, object]:
    return {
        k.replace("__", "."): TensorStorageMetadata(TensorProperties(), torch.Size(v), [])
        for k, v in shapes.items()
    }


def test_the_same_keys_and_shapes_fit() -> None:
    ours = {"model.w": torch.zeros(2, 3), "optim.state.model.w.exp_avg": torch.zeros(5)}
    saved = {**_saved(model__w=(2, 3)), "optim.param_groups.0.lr": BytesStorageMetadata()}
    assert model_misfit(ours, saved, "ckpt") is None  # only the model's entries are compared


@pytest.mark.parametrize(
    ("ours", "saved", "first"),
    [
        (
            {"model.w": (2, 3)},
            {"model__w": (2, 4)},
            "model.w is (2, 4) in the checkpoint and (2, 3) here",
        ),
        (
            {"model.a": (1,), "model.b": (1,)},
            {"model__a": (1,)},
            "this model has model.b, the checkpoint does not",
        ),
        (
            {"model.a": (1,)},
            {"model__a": (1,), "model__b": (1,)},
            "the checkpoint has model.b, this model does not",
        ),
    ],
)
def test_a_misfit_names_the_first_difference(
    ours: dict[str, tuple[int, ...]], saved: dict[str, tuple[int, ...]], first: str
) -> None:
    misfit = model_misfit({k: torch.zeros(v) for k, v in ours.items()}, _saved(**saved), "ck")
    assert isinstance(misfit, CheckpointMismatch)
    assert str(misfit).startswith(f"ck does not fit this model: {first}. It was saved with")


def test_more_differences_are_counted() -> None:
    ours = {"model.a": torch.zeros(1), "model.b": torch.zeros(1)}
    misfit = model_misfit(ours, _saved(model__a=(2,), model__b=(2,)), "ck")
    assert "model.a is (2) in the checkpoint and (1) here (and 1 more differences)" in str(misfit)


@pytest.mark.dist
@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_resume_with_fewer_layers_is_refused_in_one_line(tmp_path: Path) -> None:
    """DCP loads what the model asks for and ignores the rest of a checkpoint: a resume with
    --n-layers 2 from a 4-layer run used to complete, with half the model dropped."""
    run = tmp_path / "run"
    first = train(run, "--max-steps", "2", "--save-every", "2", "--n-layers", "4")
    assert first.returncode == 0, first.stderr[-2000:]
    proc = train(run, "--max-steps", "4", "--n-layers", "2")
    assert proc.returncode == 1, proc.stderr[-2000:]
    ckpt = run / "checkpoints" / "step-000002"
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"ilab-train: training failed: {ckpt} does not fit this model: the checkpoint has "
            "model.blocks.2."
        )
    )
    assert "Traceback" not in proc.stderr
    end = records(run)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert end["data"]["error_type"] == "CheckpointMismatch"
    assert "resume with those, or start afresh" in end["data"]["reason"]
