"""``training_hub.sft(..., backend="ilab-journal")``: training-hub 0.11.2's SFT on this trainer.

Importing this module registers the backend (training_hub reads no entry points)::

    import trainer.instructlab.hub  # noqa: F401  (registers backend "ilab-journal")
    from training_hub import sft

    sft(model_path=..., data_path=..., ckpt_output_dir=..., backend="ilab-journal",
        nproc_per_node=2, callbacks=[MyHubCallback()])

It takes the parameters training_hub's own ``instructlab-training`` backend takes, renamed
as that backend renames them (``max_tokens_per_gpu``, ``beta1``/``beta2``, ``eps``,
``weight_decay``, torchrun's from the arguments or ``PET_*`` variables), and hands the pair
to :func:`trainer.instructlab.run_training`: every field is mapped or refused by the same
table (docs/instructlab.md). A parameter training here cannot honour is one
:class:`~trainer.instructlab.InstructLabConfigError` line naming it. ``TrainingHubCallback``
objects run unchanged in this process (watcher/builtin/foreign.py), and the tracker parameters map
onto the watcher's exporters. Returns our :class:`~trainer.launch.TrainingResult`.
"""

from __future__ import annotations

import os
from typing import Any

from training_hub import utils
from training_hub.algorithms import AlgorithmRegistry, Backend
from training_hub.checkpoint_utils import resolve_checkpoint_storage

from trainer.instructlab.run import TORCH_FIELDS, InstructLabConfigError, run_training
from trainer.launch import TrainingResult

#: The name to pass as ``sft(..., backend=...)``.
BACKEND = "ilab-journal"
#: training_hub's parameter -> instructlab-training's field, as its backend renames them.
RENAMED = {
    "max_tokens_per_gpu": "max_batch_len",
    "eps": "adamw_eps",
    "weight_decay": "adamw_weight_decay",
}


def hub_to_instructlab(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(torch_args, train_args)`` as instructlab-training mappings for training_hub's SFT
    parameters (those its ``instructlab-training`` backend receives)."""
    params = dict(params)
    # sft()'s torchrun parameters: those of InstructLab's TorchrunArgs (one list, run.py)
    torch = {k: params.pop(k) for k in list(params) if k in TORCH_FIELDS}
    try:
        torch = utils.get_torchrun_params(torch)  # its precedence: arguments, PET_*, defaults
    except ValueError as exc:
        raise InstructLabConfigError(f"torchrun parameters: {exc}") from None
    if params.pop("is_pretraining", None) or params.get("block_size") is not None:
        raise InstructLabConfigError(
            "is_pretraining: not supported here (block-based pretraining sampling)"
        )
    # enable_jit_checkpoint is on_demand_checkpointing: always on here
    for unused in ("block_size", "document_column_name", "enable_jit_checkpoint"):
        params.pop(unused, None)
    storage = params.pop("checkpoint_storage", None)
    try:
        remote = resolve_checkpoint_storage(storage)
    except ValueError as exc:
        raise InstructLabConfigError(f"checkpoint_storage: {exc}") from None
    if remote:
        raise InstructLabConfigError(
            f"checkpoint_storage: mirroring checkpoints to {remote} is not supported here"
        )
    for theirs, field in RENAMED.items():
        if theirs in params:
            params[field] = params.pop(theirs)
    if "beta1" in params or "beta2" in params:
        if not ("beta1" in params and "beta2" in params):
            raise InstructLabConfigError("beta1, beta2: give both (AdamW's betas) or neither")
        params["adamw_betas"] = (params.pop("beta1"), params.pop("beta2"))
    ckpt = params.get("ckpt_output_dir")
    if ckpt is not None:
        params.setdefault("data_output_dir", os.path.join(ckpt, "data"))
    data = params.get("data_path")
    if data and not str(data).endswith(".jsonl"):  # parquet, csv, .json: as its backend does
        params["data_path"] = utils.ensure_messages_jsonl(data, params["data_output_dir"])
    params.setdefault("max_batch_len", params.get("max_seq_len", 60000))
    return torch, params


class IlabJournalSFTBackend(Backend):
    """training_hub's SFT backend ``ilab-journal``: this trainer, its journal and watcher."""

    def execute_training(self, algorithm_params: dict[str, Any]) -> TrainingResult:
        torch_args, train_args = hub_to_instructlab(algorithm_params)
        return run_training(torch_args, train_args)


AlgorithmRegistry.register_backend("sft", BACKEND, IlabJournalSFTBackend)
