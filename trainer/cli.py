"""``ilab-train``: command-line front end of ``run_training``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from trainer.config import ConfigError, TorchrunArgs, TrainingArgs, load_config_file
from trainer.rows import DataError

# CLI option -> TrainingArgs field (options left at None are not passed).
TRAIN_FIELDS = {
    "ckpt_dir": "ckpt_dir",
    "data": "data_path",
    "val_data": "val_data_path",
    "demo": "demo",
    "max_steps": "max_steps",
    "num_epochs": "num_epochs",
    "batch_size": "effective_batch_size",
    "max_batch_len": "max_batch_len",
    "lr": "lr",
    "warmup_steps": "warmup_steps",
    "seed": "seed",
    "log_every": "log_every",
    "eval_every": "eval_every",
    "save_every": "save_every",
    "keep_last_n": "keep_last_n",
    "keep_best": "keep_best",
    "resume": "resume",
    "journal_detail": "journal_detail",
    "model_path": "model_path",
    "train_on_all_tokens": "train_on_all_tokens",
    "activation_checkpointing": "activation_checkpointing",
    "demo_samples": "demo_samples",
    "backend": "backend",
    "max_seq_len": "max_seq_len",
    "mixed_precision": "mixed_precision",
    "reduce_grads": "reduce_grads",
    "sharding": "sharding",
    "model_init": "model_init",
    "export_every": "export_every",
    "export_dtype": "export_dtype",
    "pg_timeout": "pg_timeout_s",
    "packing": "packing",
    "fused_loss": "fused_loss",
    "compile": "compile",
}
MODEL_FIELDS = {
    "d_model": "d_model",
    "n_layers": "n_layers",
    "n_heads": "n_heads",
}
TORCHRUN_FIELDS = {
    "nproc_per_node": "nproc_per_node",
    "nnodes": "nnodes",
    "node_rank": "node_rank",
    "rdzv_id": "rdzv_id",
    "rdzv_endpoint": "rdzv_endpoint",
    "master_addr": "master_addr",
    "master_port": "master_port",
}
#: TrainingArgs/TorchrunArgs field -> the ilab-train flag that sets it (for error messages).
FLAG_FOR = {fld: opt for opt, fld in TRAIN_FIELDS.items()} | {
    f"model.{f}": o for o, f in MODEL_FIELDS.items()
}
EXIT_CODES = {"completed": 0, "stopped": 0, "failed": 1, "interrupted": 5}


def _errors(exc: ValidationError) -> str:
    lines = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = ".".join(str(x) for x in e["loc"])
        if e["type"] == "extra_forbidden":  # only a config file can carry unknown keys
            lines.append(f"unknown setting {loc!r} in --config")
            continue
        lines.append(f"--{FLAG_FOR.get(loc, loc).replace('_', '-')}: {msg}" if loc else msg)
    return "; ".join(lines)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON or YAML file of TrainingArgs fields (plus an optional 'torchrun' mapping); flags override it.",
)
@click.option(
    "--instructlab-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML (or JSON) of InstructLab's run_training settings: torch_args and train_args "
    "mappings with instructlab-training's field names (docs/instructlab.md); flags override it.",
)
@click.option(
    "--ckpt-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Checkpoints, journal.jsonl, control/ and logs/ go here.",
)
@click.option(
    "--data",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Training JSONL: input_ids (+labels) or text.",
)
@click.option(
    "--val-data", type=click.Path(dir_okay=False, path_type=Path), help="Validation JSONL."
)
@click.option(
    "--demo", is_flag=True, default=None, help="Built-in model and generated arithmetic demo data."
)
@click.option("--demo-samples", type=int, help="Generated demo training samples (default 6000).")
@click.option("--max-steps", type=int, help="Stop after this many optimizer steps.")
@click.option("--num-epochs", type=int, help="Epochs over the data (default 1).")
@click.option(
    "--batch-size",
    type=int,
    help="Effective batch size: samples per step over all ranks (default 64).",
)
@click.option(
    "--max-batch-len", type=int, help="Token budget of one micro-batch per rank (default 2048)."
)
@click.option("--lr", type=float, help="Peak learning rate (default 1e-3).")
@click.option(
    "--warmup-steps", type=int, help="Linear warmup steps before cosine decay (default 10)."
)
@click.option("--seed", type=int, help="Seed for init and data order (default 42).")
@click.option("--log-every", type=int, help="Steps between log records (default 1).")
@click.option("--eval-every", type=int, help="Steps between validations (default: never).")
@click.option(
    "--save-every", type=int, help="Steps between checkpoints (default: epoch end and final)."
)
@click.option("--keep-last-n", type=int, help="Checkpoints to keep (default 3).")
@click.option(
    "--keep-best",
    metavar="METRIC:max|min",
    help="Also keep the best checkpoint by a reported or evaluate metric, e.g. accuracy:max.",
)
@click.option(
    "--resume",
    type=click.Choice(["auto", "never"]),
    help="auto: continue from the latest checkpoint in --ckpt-dir.",
)
@click.option(
    "--journal-detail",
    type=click.Choice(["step", "microbatch", "off"]),
    help="step records every event but the per-micro-batch ones (default).",
)
@click.option(
    "--model-path",
    type=click.Path(exists=True, path_type=Path),
    help="Local Hugging Face causal LM directory, or a .gguf file (converted once into "
    "CKPT_DIR/model). Needs the 'hf' extra; nothing is downloaded.",
)
@click.option(
    "--train-on-all-tokens",
    is_flag=True,
    default=None,
    help="Chat data: loss on every token (default: only the assistant's replies).",
)
@click.option(
    "--activation-checkpointing",
    is_flag=True,
    default=None,
    help="Recompute each block's activations in backward: less memory, ~1/3 more compute.",
)
@click.option("--d-model", type=int, help="Built-in model width (default 128).")
@click.option("--n-layers", type=int, help="Built-in model depth (default 4).")
@click.option("--n-heads", type=int, help="Built-in model attention heads (default 4).")
@click.option(
    "--max-seq-len",
    type=int,
    help="Longest sample in tokens; longer ones are truncated (default: the model's context, "
    "64 for the built-in model).",
)
@click.option(
    "--mixed-precision",
    type=click.Choice(["auto", "bf16", "fp32"]),
    help="Compute dtype; weights and optimizer state stay fp32 (auto: bf16 on GPUs).",
)
@click.option(
    "--sharding",
    type=click.Choice(["full", "grad_op", "hybrid", "replicate"]),
    help="full (default): params, grads and optimizer state sharded over all ranks; grad_op: "
    "params stay gathered between forward and backward; hybrid: shard within a node, "
    "replicate across nodes; replicate: a whole copy per rank, DDP (small models).",
)
@click.option(
    "--reduce-grads",
    type=click.Choice(["every_micro_batch", "last_micro_batch"]),
    help="Reduce-scatter gradients after every micro-batch (default: grads stay sharded) or "
    "only after the last one (fewer collectives, unsharded grads held: small models only).",
)
@click.option(
    "--model-init",
    type=click.Choice(["meta", "full"]),
    help="meta (default): build on the meta device, shard, load weights sharded; full: every "
    "rank builds the whole model first.",
)
@click.option(
    "--export-every",
    type=click.IntRange(min=1),
    help="Write the consolidated model only at saves whose step is a multiple of N, and at "
    "the final save (default: every save).",
)
@click.option(
    "--export-dtype",
    type=click.Choice(["auto", "bf16", "fp32"]),
    help="dtype of the consolidated model (auto: what the HF config declares; fp32 built-in).",
)
@click.option(
    "--pg-timeout",
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds a collective may wait, e.g. for rank 0's export at a save (default 1800).",
)
@click.option(
    "--packing",
    type=click.Choice(["auto", "on", "off"]),
    help="Padding-free micro-batches: whole samples in one row, attention kept within each "
    "sample, --max-batch-len counts real tokens (auto: on with CUDA + bf16, where "
    "variable-length flash attention runs).",
)
@click.option(
    "--fused-loss",
    type=click.Choice(["auto", "off", "chunked", "liger"]),
    help="Output layer + cross-entropy without full-vocabulary fp32 logits (auto: liger "
    "where installed on CUDA, else chunked; off: plain logits).",
)
@click.option(
    "--compile",
    type=click.Choice(["auto", "on", "off"]),
    help="torch.compile each transformer block (auto: on with CUDA).",
)
@click.option(
    "--backend",
    type=click.Choice(["auto", "gloo", "nccl"]),
    help="auto: NCCL with GPUs, else gloo.",
)
@click.option("--nproc-per-node", type=int, help="Worker processes on this node (default 1).")
@click.option("--nnodes", type=int, help="Number of nodes (default 1).")
@click.option("--node-rank", type=int, help="This node's rank.")
@click.option("--rdzv-id", help="Rendezvous id (multi-node).")
@click.option("--rdzv-endpoint", help="host:port of the c10d rendezvous (multi-node).")
@click.option("--master-addr", help="Static rendezvous address (instead of --rdzv-endpoint).")
@click.option("--master-port", type=int, help="Static rendezvous port.")
@click.option("--quiet", is_flag=True, help="Do not echo worker output (it still goes to logs/).")
def main(config: Path | None, instructlab_config: Path | None, quiet: bool, **opts: Any) -> None:
    """Train with FSDP under torchrun, journaling every lifecycle event.

    \b
    Example (the built-in demo on 2 CPU ranks):
      ilab-train --demo --ckpt-dir runs/demo --max-steps 40 --nproc-per-node 2

    Watch it from another shell with `ilab-journal tail -f runs/demo` or react to it with
    `ilab-watch runs/demo --on-save eval.py`.

    Exit codes: 0 completed or stopped, 1 failed, 2 bad options, 3 the checkpoint dir is in
    use by another launch (the message names it), 5 interrupted.
    """
    from trainer.launch import RunDirBusy, TrainingFailed, run_training

    base: dict[str, Any] = {}
    if instructlab_config is not None:
        base = _instructlab_base(instructlab_config, config)
    elif config is not None:
        try:
            base = load_config_file(config)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    torchrun_base = base.pop("torchrun", {}) or {}
    model_base = base.pop("model", {}) or {}
    for opt, fld in TRAIN_FIELDS.items():
        if opts.get(opt) is not None:
            base[fld] = opts[opt]
    for opt, fld in MODEL_FIELDS.items():
        if opts.get(opt) is not None:
            model_base[fld] = opts[opt]
    for opt, fld in TORCHRUN_FIELDS.items():
        if opts.get(opt) is not None:
            torchrun_base[fld] = opts[opt]
    if "ckpt_dir" not in base:
        raise click.UsageError("--ckpt-dir is required (or ckpt_dir in --config)")
    try:
        targs = TrainingArgs.model_validate({**base, "model": model_base})
        trun = TorchrunArgs(**torchrun_base)
    except ValidationError as exc:
        raise click.UsageError(_errors(exc)) from None
    except TypeError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        result = run_training(targs, trun, echo=not quiet)
    except (ConfigError, DataError) as exc:  # one line, no usage banner: options parsed
        click.echo(f"ilab-train: {exc}", err=True)
        sys.exit(2)
    except RunDirBusy as exc:
        click.echo(f"ilab-train: {exc}", err=True)
        sys.exit(3)
    except OSError as exc:  # e.g. a full disk before the workers started
        click.echo(f"ilab-train: {exc.strerror or exc}: {exc.filename or targs.ckpt_dir}", err=True)
        sys.exit(1)
    except TrainingFailed as exc:
        click.echo(f"ilab-train: {exc}", err=True)
        sys.exit(1)
    click.echo(
        f"ilab-train: {result.status}"
        + (f" ({result.reason})" if result.reason else "")
        + f"; journal {result.journal_path}"
        + (f"; checkpoint {result.final_checkpoint}" if result.final_checkpoint else ""),
        err=True,
    )
    sys.exit(EXIT_CODES.get(result.status, 1))


def _instructlab_base(path: Path, config: Path | None) -> dict[str, Any]:
    """``--instructlab-config``: the mapped settings as a ``--config`` mapping (flags still
    override them); a field that cannot run here is one line naming it (exit 2)."""
    from trainer.instructlab import from_config

    if config is not None:
        raise click.UsageError("give --config or --instructlab-config, not both")
    try:
        targs, trun = from_config(path)
    except ConfigError as exc:
        click.echo(f"ilab-train: {exc}", err=True)
        sys.exit(2)
    return {**targs.data_dict(), "torchrun": trun.model_dump(exclude_none=True)}


if __name__ == "__main__":
    main()
