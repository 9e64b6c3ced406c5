"""What a rank loads before training: the training and validation step planners (a demo's
data written first, chat files tokenized once per node, a held-out validation split) and
the number of steps the run takes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Protocol

import torch.distributed as dist

from trainer.config import TrainingArgs
from trainer.data import validation_split
from trainer.data.plan import Sample, StepPlanner, load_jsonl, make_demo_data
from trainer.data.rows import DataError

log = logging.getLogger("trainer")


class SampleLimits(Protocol):
    """What the data needs of the model (:class:`trainer.model.spec.ModelSpec` has it):
    the longest sample kept, in tokens, and the bound of the token ids."""

    @property
    def context(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...


def load_data(
    args: TrainingArgs,
    spec: SampleLimits,
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

    def plan(rows: list[Sample], batch_size: int) -> StepPlanner:  # one batching for both
        return StepPlanner(
            rows, batch_size, args.max_batch_len, world, rank, args.seed, pack_kernel
        )

    planner = plan(samples, args.effective_batch_size)
    val_planner = plan(val, len(val)) if val and len(val) >= world else None
    info["train_samples"] = len(samples)
    return planner, val_planner, {k: v for k, v in info.items() if v is not None}


def _tokenized(
    args: TrainingArgs, spec: SampleLimits, path: Path, ckpt_dir: Path, local_rank: int
) -> tuple[Path, dict[str, Any] | None]:
    """A chat file's tokenized rows (one tokenizer run per node, cached next to the run);
    any other file as it is. A failure on the tokenizing rank is raised on every rank (the
    start-up collective below), so no rank waits for rows that never come."""
    from trainer.data import chat

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
    if first := next((e for e in errors if e), None):
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


def epochs_for(max_steps: int, steps_per_epoch: int) -> int:
    """The epochs it takes to train ``max_steps`` steps of ``steps_per_epoch`` each."""
    return -(-max_steps // max(1, steps_per_epoch))


def total_steps(args: TrainingArgs, steps_per_epoch: int, rank: int) -> int:
    """The run's last step: ``max_steps``, or the end of ``num_epochs`` epochs when that
    comes first (said, with the epochs ``max_steps`` takes)."""
    epoch_steps = steps_per_epoch * args.num_epochs
    if args.max_steps and args.max_steps > epoch_steps and rank == 0:
        log.warning(
            "max_steps %d is more than %d epoch(s) of %d steps: training ends at step %d "
            "(--num-epochs %d trains all %d steps)",
            args.max_steps,
            args.num_epochs,
            steps_per_epoch,
            epoch_steps,
            epochs_for(args.max_steps, steps_per_epoch),
            args.max_steps,
        )
    return min(args.max_steps, epoch_steps) if args.max_steps else epoch_steps
