"""What is known of the model before it is built (context, vocabulary, export dtype: the data
needs them first), and how one kind of model is built (:class:`ModelParts`: the built-in
model, an HF model, an HF model with LoRA adapters)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.config import TrainingArgs
from trainer.data.rows import VOCAB_SIZE

#: Writes a consolidated, torchrun-free model from a full state dict (rank 0 only).
ConsolidatedWriter = Callable[[Path, dict[str, Any]], None]


@dataclass(frozen=True)
class ModelSpec:
    """What is known of the model before it is built (the data needs it first)."""

    context: int  # longest sample kept, in tokens
    vocab_size: int  # token ids must be below it
    export_dtype: torch.dtype  # dtype of the consolidated model
    hf_config: Any = None  # the HF config, None for the built-in model


def model_spec(args: TrainingArgs) -> ModelSpec:
    """Context, vocabulary and export dtype from the config alone (no weights read)."""
    dtypes = {"bf16": torch.bfloat16, "fp32": torch.float32}
    if args.model_path is None:
        export = dtypes.get(args.export_dtype, torch.float32)
        return ModelSpec(args.model.max_seq_len, VOCAB_SIZE, export)
    from trainer.model.hf_model import context_length, declared_dtype, hf_config

    config = hf_config(Path(args.model_path))
    context = args.max_seq_len or context_length(config)
    if context is None:
        raise ValueError(
            f"{args.model_path}: the config names no context length: give --max-seq-len"
        )
    export = dtypes.get(args.export_dtype) or declared_dtype(config)
    return ModelSpec(context, int(config.vocab_size), export, config)


@dataclass(frozen=True)
class ModelParts:
    """How to build one kind of model: the whole model (fp32), its block list, the other
    FSDP units, and its consolidated writer given the tied parameter names."""

    make: Callable[[], nn.Module]
    train_forward: Callable[[nn.Module, str], Any]  # loss forward with this loss kernel
    blocks: Callable[[Any], nn.ModuleList]
    extra_units: Callable[[Any], list[list[nn.Module]]]
    writer: Callable[[set[str]], ConsolidatedWriter]
