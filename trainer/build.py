"""What a rank builds before training: device and backend, the FSDP2-sharded model, the data
planners and the step count. One code path for CPU/gloo and GPU/NCCL."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from trainer.checkpoint import ConsolidatedWriter
from trainer.config import TrainingArgs
from trainer.data import StepPlanner, load_jsonl, make_demo_data
from trainer.model import (
    VOCAB_SIZE,
    TinyGPT,
    build_hf_model,
    hf_decoder_layers,
    save_consolidated,
    save_hf_consolidated,
)

log = logging.getLogger("trainer")


def device_and_backend(args: TrainingArgs, local_rank: int) -> tuple[torch.device, str]:
    use_cuda = torch.cuda.is_available() and args.backend != "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        raise RuntimeError("backend 'nccl' needs CUDA, and no GPU is visible")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), "nccl"
    return torch.device("cpu"), "gloo"


def build_model(
    args: TrainingArgs, device: torch.device
) -> tuple[torch.nn.Module, ConsolidatedWriter]:
    """The model, FSDP2-sharded per block, and how to write its consolidated checkpoint."""
    write: ConsolidatedWriter
    if args.model_path is not None:
        model = build_hf_model(Path(args.model_path))
        blocks = hf_decoder_layers(model)
        write = partial(save_hf_consolidated, model.config)
    else:
        model = TinyGPT(args.model)
        blocks = model.shardable_blocks()
        cfg = {
            "model_type": "ilab-tinygpt",
            "model": args.model.model_dump(),
            "vocab_size": VOCAB_SIZE,
        }
        write = partial(_save_builtin, cfg=cfg)
    model.to(device)
    bf16 = device.type == "cuda" and args.mixed_precision in ("auto", "bf16")
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if bf16
        else MixedPrecisionPolicy()
    )
    for block in blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, write


def _save_builtin(
    out_dir: Path, state_dict: dict[str, torch.Tensor], *, cfg: dict[str, Any]
) -> None:
    save_consolidated(out_dir, state_dict, cfg)


def load_data(
    args: TrainingArgs, ckpt_dir: Path, rank: int, world: int, local_rank: int
) -> tuple[StepPlanner, StepPlanner | None, int]:
    """Training and validation planners (and the training sample count)."""
    data_path, val_path = args.data_path, args.val_data_path
    if args.demo:
        demo_dir = ckpt_dir / "demo_data"
        if local_rank == 0:  # one writer per node (same seed: same bytes everywhere)
            make_demo_data(demo_dir, n_train=args.demo_samples, seed=args.seed)
        dist.barrier()
        data_path, val_path = demo_dir / "train.jsonl", val_path or demo_dir / "val.jsonl"
    assert data_path is not None  # TrainingArgs requires data_path unless demo
    vocab = VOCAB_SIZE if args.model_path is None else None
    seq = args.model.max_seq_len
    samples = load_jsonl(Path(data_path), seq, vocab)
    val = load_jsonl(Path(val_path), seq, vocab) if val_path else None
    planner = StepPlanner(
        samples, args.effective_batch_size, args.max_batch_len, world, rank, args.seed
    )
    val_planner = (
        StepPlanner(val, len(val), args.max_batch_len, world, rank, args.seed)
        if val and len(val) >= world
        else None
    )
    return planner, val_planner, len(samples)


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
