"""Does a checkpoint fit the model it is about to be loaded into?

A resume with other model settings (``--d-model``, ``--n-layers``, another ``--model-path``,
LoRA on or off) would otherwise fail deep inside DCP (``CheckpointException ranks: [0, 1]``),
or, with fewer layers, load the matching part silently: DCP ignores what the checkpoint has
beyond what is asked for. Here the model's keys and shapes are compared with the
checkpoint's metadata before anything is read, and a misfit is one line naming the first
difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from trainer.checkpoint.files import CheckpointError, SafeLoadPlanner

#: The prefix of the model's entries in a checkpoint (``{"model": ..., "optim": ...}``).
MODEL_PREFIX = "model."


class CheckpointMismatch(CheckpointError):
    """The checkpoint was saved from a model of another shape (a user's mistake, one line)."""


def model_misfit(
    state_dict: Mapping[str, Any], saved: Mapping[str, Any], checkpoint: str
) -> CheckpointMismatch | None:
    """Compare the model entries of a flattened state dict (what will be loaded into) with
    the checkpoint's ``state_dict_metadata`` (``saved``); None when every key and shape
    agrees, else the error to raise."""
    ours = {k: tuple(v.shape) for k, v in state_dict.items() if k.startswith(MODEL_PREFIX)}
    theirs = {
        k: tuple(v.size)
        for k, v in saved.items()
        if k.startswith(MODEL_PREFIX) and isinstance(v, TensorStorageMetadata)
    }
    problems = [
        f"{k} is {_shape(theirs[k])} in the checkpoint and {_shape(ours[k])} here"
        for k in sorted(ours.keys() & theirs.keys())
        if ours[k] != theirs[k]
    ]
    problems += [
        f"this model has {k}, the checkpoint does not" for k in sorted(ours.keys() - theirs)
    ]
    problems += [
        f"the checkpoint has {k}, this model does not" for k in sorted(theirs.keys() - ours)
    ]
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more differences)" if len(problems) > 1 else ""
    return CheckpointMismatch(
        f"{checkpoint} does not fit this model: {problems[0]}{more}. It was saved with other "
        "model settings: resume with those, or start afresh (--resume never, or another "
        "--ckpt-dir)"
    )


def _shape(size: tuple[int, ...]) -> str:
    return "(" + ", ".join(map(str, size)) + ")"


class FittingLoadPlanner(SafeLoadPlanner):
    """:class:`SafeLoadPlanner` that first checks the checkpoint fits the model
    (:func:`model_misfit`); the error is kept in ``refused``, as DCP wraps what a planner
    raises in an exception of its own."""

    def __init__(self, path: Path, checkpoint: str) -> None:
        super().__init__(path)
        self.checkpoint = checkpoint

    def set_up_planner(
        self,
        state_dict: dict[str, Any],
        metadata: Metadata | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, metadata, is_coordinator)
        if metadata is not None:
            misfit = model_misfit(self.state_dict, metadata.state_dict_metadata, self.checkpoint)
            if misfit is not None:
                self.refused = misfit
                raise misfit
