"""The model a rank trains, built and FSDP2-sharded (or DDP-replicated), its weights loaded.
One code path for CPU/gloo and GPU/NCCL; the device, spec and data come from
:mod:`trainer.model.device`, :mod:`trainer.model.spec` and :mod:`trainer.data.load`.

The model is built the way a 7B fine-tune needs it (docs/gpu.md):

1. on the meta device (no memory), then sharded with ``fully_shard``: one unit per block,
   one for the embeddings and one for final norm + head (when not tied), the root last;
2. materialized shard by shard (``to_empty``), and the weights loaded into the shards:
   rank 0 reads the whole model once and broadcasts (``set_model_state_dict(...,
   broadcast_from_rank0=True)``), so the other ranks never hold more than their shards;
3. in fp32, always: bf16 is a compute dtype (``MixedPrecisionPolicy``), never the dtype of
   the weights, grads or optimizer state.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.config import TrainingArgs
from trainer.model.attention import register_hf_attention
from trainer.model.builtin import VOCAB_SIZE, TinyGPT, save_consolidated
from trainer.model.device import compute_dtype
from trainer.model.kernels import Kernels, compile_blocks
from trainer.model.spec import ConsolidatedWriter, ModelParts, ModelSpec, model_spec

log = logging.getLogger("trainer")


def build_model(
    args: TrainingArgs, spec: ModelSpec, device: torch.device, kernels: Kernels
) -> tuple[nn.Module, ConsolidatedWriter]:
    """The model, FSDP2-sharded, its weights loaded, and how to write its consolidated copy.
    Its forward takes a :class:`trainer.data.plan.Batch`'s ``model_kwargs()`` and returns the
    summed loss (through the loss kernel ``kernels.loss``)."""
    parts = _model_parts(args, spec)
    meta = args.model_init == "meta"
    # meta: parameters without memory; else every rank builds (and initializes) the whole model
    model = _meta_model(parts) if meta else parts.make().to(device)
    parts.train_forward(model, kernels.loss)
    write = parts.writer(tied_names(model))
    blocks = parts.blocks(model)
    if kernels.compile:  # before the checkpoint wrapper and FSDP: their hooks stay eager
        compile_blocks(blocks)
    if args.activation_checkpointing:  # inside the FSDP units, as torchtitan does
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        for i, block in enumerate(blocks):
            blocks[i] = checkpoint_wrapper(block)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    units = [[b] for b in blocks] + parts.extra_units(model)
    ddp = args.sharding == "replicate"
    if not ddp:
        _shard(model, units, compute_dtype(args, device), args.sharding, device)
    if meta:
        model.to_empty(device=device)  # this rank's shards only
        with torch.no_grad():  # non-persistent buffers (e.g. rotary tables) are in no state dict
            for name, b in model.named_buffers():
                b.copy_(buffers[name])
        full = parts.make().state_dict() if dist.get_rank() == 0 else {}
        set_model_state_dict(
            model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        )
        del full
    return (_ddp(model, device) if ddp else model), write


def consolidated_writer(args: TrainingArgs) -> ConsolidatedWriter:
    """How a run writes its consolidated model, without building its weights (for an export
    made later from a checkpoint's shards: :mod:`trainer.checkpoint.export`)."""
    parts = _model_parts(args, model_spec(args))
    return parts.writer(tied_names(_meta_model(parts)))


def _meta_model(parts: ModelParts) -> nn.Module:
    """The model with its parameters on the meta device (no memory, no initialization)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):  # parameters on meta, buffers real
        model = parts.make()
    tie = getattr(model, "tie_weights", None)
    if callable(tie):  # inside the context a tie became two meta params
        tie()
    return model


def _ddp(model: nn.Module, device: torch.device) -> nn.Module:
    """``--sharding replicate``: a whole fp32 copy per rank under DDP, whose bucketed
    gradient all-reduce overlaps backward. For models that fit on one device it beats
    FSDP's per-unit collectives (bench_hf_peer); bf16 compute runs under autocast."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None)


def tied_names(model: nn.Module) -> set[str]:
    """Names of parameters that are another parameter (tied weights): the export keeps one."""
    first = {name for name, _ in model.named_parameters()}
    return {name for name, _ in model.named_parameters(remove_duplicate=False)} - first


def _model_parts(args: TrainingArgs, spec: ModelSpec) -> ModelParts:
    if args.model_path is not None:
        from trainer.model.hf_model import (
            build_hf_model,
            hf_decoder_layers,
            hf_shard_units,
            save_hf_consolidated,
        )
        from trainer.model.lm_head import with_loss_forward

        path, config = Path(args.model_path), spec.hf_config
        parts = ModelParts(
            make=partial(build_hf_model, path, config, register_hf_attention()),
            train_forward=with_loss_forward,
            blocks=hf_decoder_layers,
            extra_units=hf_shard_units,
            writer=lambda tied: partial(
                save_hf_consolidated, config, dtype=spec.export_dtype, drop=tied, source=path
            ),
        )
        if args.lora_rank is None:
            return parts
        from trainer.model.lora import with_adapters

        return with_adapters(parts, args, path, spec.export_dtype)
    cfg = {"model_type": "ilab-tinygpt", "model": args.model.model_dump(), "vocab_size": VOCAB_SIZE}
    cfg["dtype"] = str(spec.export_dtype).removeprefix("torch.")
    return ModelParts(
        make=partial(TinyGPT, args.model),
        train_forward=lambda m, loss: setattr(m.head, "impl", loss),
        blocks=lambda m: m.blocks,
        extra_units=lambda m: m.shard_units(),
        writer=lambda tied: partial(save_consolidated, cfg=cfg, dtype=spec.export_dtype),
    )


def _shard(
    model: nn.Module,
    units: list[list[nn.Module]],
    compute: torch.dtype,
    sharding: str,
    device: torch.device,
) -> None:
    """``fully_shard`` each unit, then the root (which then holds only what is left).

    ``full`` shards parameters, grads and optimizer state over every rank and frees the
    gathered parameters after forward (gathered again for backward); ``grad_op`` keeps them
    gathered from forward to backward (one all-gather per unit and step instead of two:
    more memory, fewer collectives); ``hybrid`` shards within a node and replicates across
    nodes (HSDP: the slow inter-node links carry only the gradient all-reduce);
    (``replicate`` does not come here: it is plain DDP, see :func:`_ddp`)."""
    from torch.distributed.device_mesh import init_device_mesh

    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    world = dist.get_world_size()
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    replicas = {"full": 1, "grad_op": 1, "hybrid": world // per_node}[sharding]
    mesh = init_device_mesh(
        device.type, (replicas, world // replicas), mesh_dim_names=("replicate", "shard")
    )
    kw: dict[str, Any] = {
        "mp_policy": mp,
        "mesh": mesh if replicas > 1 else mesh["shard"],
        "reshard_after_forward": sharding != "grad_op",
    }
    for unit in units:
        fully_shard(unit if len(unit) > 1 else unit[0], **kw)
    fully_shard(model, **kw)
