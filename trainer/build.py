"""What a rank builds before training: device and backend, the FSDP2-sharded model, the data
planners and the step count. One code path for CPU/gloo and GPU/NCCL.

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer import validation_split
from trainer.attention import register_hf_attention
from trainer.checkpoint import ConsolidatedWriter
from trainer.config import TrainingArgs
from trainer.data import DataError, StepPlanner, load_jsonl, make_demo_data
from trainer.kernels import Kernels, compile_blocks
from trainer.model import VOCAB_SIZE, TinyGPT, save_consolidated

log = logging.getLogger("trainer")


def device_and_backend(args: TrainingArgs, local_rank: int) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend 'nccl' needs CUDA, and no GPU is visible")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


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
    from trainer.hf_model import context_length, declared_dtype, hf_config

    config = hf_config(Path(args.model_path))
    context = args.max_seq_len or context_length(config)
    if context is None:
        raise ValueError(
            f"{args.model_path}: the config names no context length: give --max-seq-len"
        )
    export = dtypes.get(args.export_dtype) or declared_dtype(config)
    return ModelSpec(context, int(config.vocab_size), export, config)


def compute_dtype(args: TrainingArgs, device: torch.device) -> torch.dtype:
    """bf16 when asked (any device) or by default on GPUs that have it (compute capability
    8.0 and up); fp32 otherwise."""
    if args.mixed_precision == "bf16":
        return torch.bfloat16
    if args.mixed_precision == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


@dataclass(frozen=True)
class ModelParts:
    """How to build one kind of model: the whole model (fp32), its block list, the other
    FSDP units, and its consolidated writer given the tied parameter names."""

    make: Callable[[], nn.Module]
    train_forward: Callable[[nn.Module, str], Any]  # loss forward with this loss kernel
    blocks: Callable[[Any], nn.ModuleList]
    extra_units: Callable[[Any], list[list[nn.Module]]]
    writer: Callable[[set[str]], ConsolidatedWriter]


def build_model(
    args: TrainingArgs, spec: ModelSpec, device: torch.device, kernels: Kernels
) -> tuple[nn.Module, ConsolidatedWriter]:
    """The model, FSDP2-sharded, its weights loaded, and how to write its consolidated copy.
    Its forward takes a :class:`trainer.data.Batch`'s ``model_kwargs()`` and returns the
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
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        for i, block in enumerate(blocks):
            blocks[i] = checkpoint_wrapper(block)
    buffers = {name: b.clone() for name, b in model.named_buffers()}
    units = [[b] for b in blocks] + parts.extra_units(model)
    ddp = args.sharding == "replicate"
    if not ddp:
        _shard(model, units, compute_dtype(args, device), args.sharding, device)
    if not meta:
        return (_ddp(model, device) if ddp else model), write
    model.to_empty(device=device)  # this rank's shards only
    with torch.no_grad():  # non-persistent buffers (e.g. rotary tables) are in no state dict
        for name, b in model.named_buffers():
            b.copy_(buffers[name])
    full = parts.make().state_dict() if dist.get_rank() == 0 else {}
    set_model_state_dict(
        model,
        full,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del full
    return (_ddp(model, device) if ddp else model), write


def consolidated_writer(args: TrainingArgs) -> ConsolidatedWriter:
    """How a run writes its consolidated model, without building its weights (for an export
    made later from a checkpoint's shards: :mod:`trainer.export`)."""
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
        from trainer.hf_model import (
            build_hf_model,
            hf_decoder_layers,
            hf_shard_units,
            save_hf_consolidated,
        )
        from trainer.lm_head import with_loss_forward

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
        from trainer.lora import with_adapters

        return with_adapters(parts, args, path, spec.export_dtype)
    cfg = {"model_type": "ilab-tinygpt", "model": args.model.model_dump(), "vocab_size": VOCAB_SIZE}
    cfg["dtype"] = str(spec.export_dtype).removeprefix("torch.")
    return ModelParts(
        make=partial(TinyGPT, args.model),
        train_forward=lambda m, loss: setattr(m.head, "impl", loss),
        blocks=lambda m: m.blocks,
        extra_units=lambda m: m.shard_units(),
        writer=lambda tied: partial(_save_builtin, cfg=cfg, dtype=spec.export_dtype),
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


def check_fp32_master(model: nn.Module, optimizer: torch.optim.Optimizer) -> str:
    """Raise unless every parameter, gradient and optimizer state tensor is fp32 (bf16 is
    for compute only); returns a one-line summary for the rank's log."""
    seen: dict[str, set[str]] = {"params": set(), "grads": set(), "optimizer state": set()}
    for p in model.parameters():
        seen["params"].add(str(p.dtype))
        if p.grad is not None:
            seen["grads"].add(str(p.grad.dtype))
    for st in optimizer.state.values():
        for v in st.values():
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.dim() > 0:
                seen["optimizer state"].add(str(v.dtype))
    bad = {k: v for k, v in seen.items() if v - {"torch.float32"}}
    if bad:
        raise RuntimeError(f"master weights must be fp32; found {bad}")
    return ", ".join(f"{k} {'/'.join(sorted(v)) or '-'}" for k, v in seen.items())


def _save_builtin(
    out_dir: Path, state_dict: dict[str, torch.Tensor], *, cfg: dict[str, Any], dtype: torch.dtype
) -> None:
    save_consolidated(out_dir, state_dict, cfg, dtype)


def load_data(
    args: TrainingArgs,
    spec: ModelSpec,
    ckpt_dir: Path,
    rank: int,
    world: int,
    local_rank: int,
    pack_kernel: str | None = None,
) -> tuple[StepPlanner, StepPlanner | None, dict[str, Any]]:
    """Training and validation planners, and what the data holds (for train_begin).
    Samples are cut to the model's context; a token id outside its vocabulary is a
    DataError (on CUDA it would be a device-side assert while the other ranks hang in a
    collective). Chat (``messages``) files are tokenized with the model's chat template."""
    data_path, val_path = args.data_path, args.val_data_path
    if args.demo:
        demo_dir = ckpt_dir / "demo_data"
        if local_rank == 0:  # one writer per node (same seed: same bytes everywhere)
            make_demo_data(demo_dir, n_train=args.demo_samples, seed=args.seed)
        dist.barrier()
        data_path, val_path = demo_dir / "train.jsonl", val_path or demo_dir / "val.jsonl"
    assert data_path is not None  # TrainingArgs requires data_path unless demo
    info: dict[str, Any] = {}
    data_path, info["chat"] = _tokenized(args, spec, Path(data_path), ckpt_dir, local_rank)
    if val_path:
        val_path, info["val_chat"] = _tokenized(args, spec, Path(val_path), ckpt_dir, local_rank)
    samples = load_jsonl(Path(data_path), spec.context, spec.vocab_size)
    val = load_jsonl(Path(val_path), spec.context, spec.vocab_size) if val_path else None
    if args.validation_split:  # held out of the training data instead (a demo's val too)
        info["validation_split"] = validation_split.describe(
            len(samples), args.validation_split, args.seed
        )
        samples, val = validation_split.split(samples, args.validation_split, args.seed)
    planner = StepPlanner(
        samples, args.effective_batch_size, args.max_batch_len, world, rank, args.seed, pack_kernel
    )
    val_planner = (
        StepPlanner(val, len(val), args.max_batch_len, world, rank, args.seed, pack_kernel)
        if val and len(val) >= world
        else None
    )
    info["train_samples"] = len(samples)
    return planner, val_planner, {k: v for k, v in info.items() if v is not None}


def _tokenized(
    args: TrainingArgs, spec: ModelSpec, path: Path, ckpt_dir: Path, local_rank: int
) -> tuple[Path, dict[str, Any] | None]:
    """A chat file's tokenized rows (one tokenizer run per node, cached next to the run);
    any other file as it is. A failure on the tokenizing rank is raised on every rank (the
    start-up collective below), so no rank waits for rows that never come."""
    from trainer import chat

    if not chat.is_chat_file(path):
        return path, None
    if args.model_path is None:
        raise DataError(f"{path}: chat (messages) data needs --model-path with a tokenizer")
    model_path = Path(args.model_path)
    settings = (path, model_path, ckpt_dir, spec.context, args.train_on_all_tokens)
    error = None
    prepared = None
    if local_rank == 0:
        try:
            prepared = chat.prepare_chat_data(*settings)
        except DataError as exc:
            error = str(exc)
    errors: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first:
        raise DataError(first)
    out, stats, hit = prepared or (*chat.cached_chat_data(*settings), False)
    if stats.dropped_too_long and dist.get_rank() == 0:
        log.warning(
            "%s: %d of %d rows are longer than max_seq_len %d after templating: dropped "
            "(first: %s)",
            path,
            stats.dropped_too_long,
            stats.rows,
            spec.context,
            stats.first_dropped,
        )
    return out, {**stats.__dict__, "tokenized": str(out), "cache_hit": hit}


def total_steps(args: TrainingArgs, steps_per_epoch: int, rank: int) -> int:
    epoch_steps = steps_per_epoch * args.num_epochs
    if args.max_steps and args.max_steps > epoch_steps and rank == 0:
        log.warning(
            "max_steps %d is more than %d epoch(s) of %d steps: training ends at step %d "
            "(raise num_epochs to train longer)",
            args.max_steps,
            args.num_epochs,
            steps_per_epoch,
            epoch_steps,
        )
    return min(args.max_steps, epoch_steps) if args.max_steps else epoch_steps
