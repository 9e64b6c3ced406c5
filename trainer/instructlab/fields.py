"""Every field of instructlab-training 0.16.2's ``TrainingArgs`` and ``TorchrunArgs``, and
what it becomes here: the one table :mod:`trainer.instructlab` maps with and
docs/instructlab.md describes.

Each field is one :class:`Rule`: ``supported`` (same meaning, maybe another name),
``mapped`` (a different setting here gives InstructLab's behaviour; the note says how),
``refused`` (a value other than its no-op one is an error naming the field: training here
could not do what it asks) or ``ignored`` (no value can change what training computes: the
note says why). A field absent from the user's mapping takes InstructLab's default, through
the same rule, so a run behaves as InstructLab's would with the same input.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["supported", "mapped", "refused", "ignored"]
#: ``(value, every train_args field with defaults applied) -> our TrainingArgs fields``.
ToOurs = Callable[[Any, Mapping[str, Any]], dict[str, Any]]


class Refused(ValueError):
    """A field set to something training here cannot do; the message is the reason, and
    ``sub`` names the nested field at fault (``deepspeed_options.<sub>``)."""

    def __init__(self, why: str, sub: str | None = None) -> None:
        super().__init__(why)
        self.sub = sub


class _Required:
    def __repr__(self) -> str:
        return "required"


#: The default of a field InstructLab requires.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Rule:
    kind: Kind
    default: Any  # InstructLab's default (REQUIRED: it has none)
    ours: tuple[str, ...]  # the TrainingArgs fields it sets here
    to_ours: ToOurs
    note: str = ""


def same(ours: str, default: Any = REQUIRED, note: str = "") -> Rule:
    """The same setting under ``ours`` (``supported``)."""
    return Rule("supported", default, (ours,), lambda v, _a: {ours: v}, note)


def mapped(ours: tuple[str, ...], default: Any, fn: ToOurs, note: str) -> Rule:
    return Rule("mapped", default, ours, fn, note)


def refused(noop: Any, why: str, *also: Any) -> Rule:
    """Accepted only at its no-op value ``noop`` (InstructLab's default) or one of ``also``."""

    def check(value: Any, _a: Mapping[str, Any]) -> dict[str, Any]:
        if value != noop and value not in also:
            raise Refused(why)
        return {}

    return Rule("refused", noop, (), check, why)


def ignored(default: Any, why: str) -> Rule:
    return Rule("ignored", default, (), lambda _v, _a: {}, why)


def _fsdp(value: Mapping[str, Any], _a: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(value) - {"cpu_offload_params", "sharding_strategy"}
    if unknown:
        raise Refused(f"unknown fsdp_options field(s) {sorted(unknown)}")
    if value.get("cpu_offload_params"):
        raise Refused("not supported (parameters stay on the accelerator)", "cpu_offload_params")
    strategy = value.get("sharding_strategy", "HYBRID_SHARD")
    if strategy not in SHARDING:
        raise Refused(f"{strategy!r} is not one of {sorted(SHARDING)}", "sharding_strategy")
    return {"sharding": SHARDING[strategy]}


#: InstructLab's LoraOptions defaults (a ``lora`` mapping may leave any field out).
LORA_DEFAULTS: dict[str, Any] = {
    "rank": 4,
    "alpha": 32,
    "dropout": 0.1,
    "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "quantize_data_type": None,
}


def _lora(value: Mapping[str, Any] | None, _a: Mapping[str, Any]) -> dict[str, Any]:
    if value is None:
        return {}
    unknown = set(value) - set(LORA_DEFAULTS)
    if unknown:
        raise Refused(f"unknown lora field(s) {sorted(unknown)}")
    lora = {**LORA_DEFAULTS, **value}
    if lora["quantize_data_type"] not in (None, "none", "None"):
        raise Refused("quantized LoRA (nf4) is not supported", "quantize_data_type")
    if not lora["rank"]:  # rank 0: InstructLab's full fine-tune
        return {}
    return {
        "lora_rank": lora["rank"],
        "lora_alpha": lora["alpha"],
        "lora_dropout": lora["dropout"],
        "lora_target_modules": list(lora["target_modules"]),
    }


def _deepspeed(value: Mapping[str, Any], _a: Mapping[str, Any]) -> dict[str, Any]:
    for key, v in value.items():
        if v != DEEPSPEED_NOOP.get(key, object()):
            raise Refused("DeepSpeed is not supported (training here runs FSDP2)", key)
    return {}


def _packing(_v: Any, a: Mapping[str, Any]) -> dict[str, Any]:
    if a["is_padding_free"] and a["disable_flash_attn"]:
        raise Refused("is_padding_free and disable_flash_attn contradict each other")
    if a["disable_flash_attn"]:
        return {"packing": "off"}
    return {"packing": "on"} if a["is_padding_free"] else {}


def _callbacks(value: list[Any] | None, _a: Mapping[str, Any]) -> dict[str, Any]:
    for cb in value or []:
        if not any(n.startswith("on_") and callable(getattr(cb, n)) for n in dir(cb)):
            raise Refused(f"{type(cb).__name__!r} object has no on_<hook> method")
    return {"callbacks": list(value or [])}


def _validation_frequency(value: int | None, a: Mapping[str, Any]) -> dict[str, Any]:
    if a["validation_split"] > 0 and (value is None or value <= 0):
        raise Refused("must be > 0 when validation_split > 0 (as in InstructLab)")
    return {"eval_every": value} if a["validation_split"] > 0 else {}


SHARDING = {
    "FULL_SHARD": "full",
    "SHARD_GRAD_OP": "grad_op",
    "HYBRID_SHARD": "hybrid",
    "NO_SHARD": "replicate",
}
DEEPSPEED_NOOP = {
    "cpu_offload_optimizer": False,
    "cpu_offload_optimizer_ratio": 1,
    "cpu_offload_optimizer_pin_memory": False,
    "save_samples": None,
}
#: InstructLab's tracker fields -> our ``tracker_settings`` key, and what each sets.
_TRACKERS = {
    "mlflow_tracking_uri": ("mlflow_tracking_uri", "report_to mlflow, to this tracking URI"),
    "mlflow_experiment_name": ("mlflow_experiment", "report_to mlflow, in this experiment"),
    "mlflow_run_name": ("mlflow_run_name", "report_to mlflow, the MLflow run's name"),
    "wandb_project": ("wandb_project", "report_to wandb, in this project"),
    "wandb_entity": ("wandb_entity", "the W&B entity (with wandb_project)"),
    "wandb_run_name": ("wandb_run_name", "the W&B run's name (with wandb_project)"),
    "tensorboard_log_dir": ("tensorboard_dir", "report_to tensorboard, into this directory"),
}


def _trackers(_v: Any, a: Mapping[str, Any]) -> dict[str, Any]:
    """The trackers InstructLab's logger would enable (its setup_metric_logger's rules,
    environment variables included), with their settings."""
    env = os.environ
    report = []
    if a["tensorboard_log_dir"]:
        report.append("tensorboard")
    mlflow_env = env.get("MLFLOW_TRACKING_URI") or env.get("MLFLOW_EXPERIMENT_NAME")
    if any(a[k] for k in _TRACKERS if k.startswith("mlflow_")) or mlflow_env:
        report.append("mlflow")
    if a["wandb_project"] or env.get("WANDB_PROJECT"):
        report.append("wandb")
    settings = {ours: str(a[k]) for k, (ours, _) in _TRACKERS.items() if a[k] is not None}
    return {"report_to": report, "tracker_settings": settings} if report else {}


_OWN_TEMPLATE = "not supported: messages are formatted with the tokenizer's own chat template"

#: instructlab-training 0.16.2 ``TrainingArgs``, in its order.
TRAIN_RULES: dict[str, Rule] = {
    "model_path": same(
        "model_path", note="a local Hugging Face directory or .gguf file; nothing is downloaded"
    ),
    "chat_tmpl_path": refused(None, _OWN_TEMPLATE),
    "use_legacy_tmpl": refused(False, _OWN_TEMPLATE),
    "data_path": mapped(
        ("data_path",),
        REQUIRED,
        lambda v, a: {"data_path": v} if a["process_data"] else {},
        "the training file when process_data is true: chat `messages` rows are tokenized "
        "with the model's chat template, processed `input_ids`/`labels` rows load as they are",
    ),
    "ckpt_output_dir": same("ckpt_dir", note="also holds journal.jsonl, control/ and logs/"),
    "data_output_dir": mapped(
        ("data_path",),
        REQUIRED,
        lambda v, a: {} if a["process_data"] else {"data_path": Path(v) / "data.jsonl"},
        "process_data false: training reads DATA_OUTPUT_DIR/data.jsonl, as InstructLab "
        "does; true: nothing is written there (tokenized chat rows are cached in the run)",
    ),
    "max_seq_len": same(
        "max_seq_len",
        note="chat rows longer after templating are dropped, as InstructLab's processing "
        "drops them; longer processed rows are truncated",
    ),
    "max_batch_len": same("max_batch_len", note="token budget of one micro-batch per rank"),
    "num_epochs": same("num_epochs", 1),
    "effective_batch_size": same("effective_batch_size"),
    "save_samples": mapped(
        ("save_samples",),
        0,
        lambda v, _a: {"save_samples": v if v > 0 else None},
        "a checkpoint at the first step boundary at or past each multiple; 0 or less: none",
    ),
    "learning_rate": same(
        "lr", note="peak of linear warmup then cosine decay to 0 (InstructLab's default)"
    ),
    "adamw_weight_decay": same("weight_decay", 0.0),
    "adamw_betas": mapped(
        ("adam_betas",), (0.9, 0.95), lambda v, _a: {"adam_betas": tuple(v)}, "AdamW's betas"
    ),
    "adamw_eps": same("adam_eps", 1e-8),
    "warmup_steps": same("warmup_steps", 0),
    "random_seed": same(
        "seed", 42, "data order and validation split; not bit-identical to InstructLab's"
    ),
    "use_dolomite": refused(False, "not supported (InstructLab 0.16.2 removed Dolomite too)"),
    "is_padding_free": mapped(
        ("packing",),
        False,
        _packing,
        "true: packing=on (padding-free micro-batches); false: packing=auto (padding-free "
        "where variable-length flash attention runs)",
    ),
    "checkpoint_at_epoch": same("save_at_epoch_end", True),
    "accelerate_full_state_at_epoch": ignored(
        True, "every checkpoint here holds the full training state and can be resumed from"
    ),
    "mock_data": refused(False, "not supported: give real data (or ilab-train --demo)"),
    "mock_data_len": ignored(0, "only read with mock_data, which is refused"),
    "deepspeed_options": Rule(
        "refused", DEEPSPEED_NOOP, (), _deepspeed, "refused unless every option is at its default"
    ),
    "fsdp_options": mapped(
        ("sharding",),
        {"cpu_offload_params": False, "sharding_strategy": "HYBRID_SHARD"},
        _fsdp,
        "sharding_strategy FULL_SHARD/SHARD_GRAD_OP/HYBRID_SHARD/NO_SHARD: sharding "
        "full/grad_op/hybrid/replicate; cpu_offload_params true is refused",
    ),
    "distributed_backend": refused("fsdp", "deepspeed is not supported (training here runs FSDP2)"),
    "disable_flash_attn": mapped(
        ("packing",),
        False,
        _packing,
        "true: packing=off (padded micro-batches, as InstructLab without flash attention)",
    ),
    "lora": mapped(
        ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules"),
        None,
        _lora,
        "rank/alpha/dropout/target_modules: lora_rank/lora_alpha/lora_dropout/"
        "lora_target_modules (rank 0: full fine-tune); quantize_data_type nf4 is refused",
    ),
    "process_data": mapped(
        (), True, lambda _v, _a: {}, "chooses the training file: see data_path, data_output_dir"
    ),
    "keep_last_checkpoint_only": mapped(
        ("keep_last_n",),
        False,
        lambda v, _a: {"keep_last_n": 1 if v else None},
        "true: keep_last_n=1; false: every checkpoint is kept, as in InstructLab",
    ),
    "pretraining_config": refused(None, "not supported: block-based pretraining sampling"),
    "data_process_num_cpu_procs": ignored(16, "processes of InstructLab's data processing step"),
    "use_liger": mapped(
        ("fused_loss",),
        False,
        lambda v, _a: {"fused_loss": "liger"} if v else {},
        "true: fused_loss=liger (needs liger-kernel and CUDA); false: fused_loss=auto",
    ),
    "trust_remote_code": refused(False, "not supported: models with custom code are not loaded"),
    "log_level": ignored("INFO", "console verbosity only"),
    **{
        name: mapped(
            ("report_to", "tracker_settings"),
            None,
            _trackers,
            f"{note}; run by the launcher from the journal, as ilab-train --report-to runs it",
        )
        for name, (_, note) in _TRACKERS.items()
    },
    "validation_split": same("validation_split", 0.0),
    "validation_frequency": mapped(
        ("eval_every",),
        None,
        _validation_frequency,
        "eval_every, when validation_split > 0 (evaluate records with val_loss)",
    ),
    "on_demand_checkpointing": mapped(
        (),
        False,
        lambda _v, _a: {},
        "always on here: SIGTERM/SIGINT save at the next step boundary and end the run",
    ),
    "callbacks": mapped(
        ("callbacks",),
        None,
        _callbacks,
        "the same objects run in the launching process, once (not per rank), in journal "
        "order, given their TrainingContext; they may return a journal.Control",
    ),
}

#: Settings of ours that no field sets, fixed to InstructLab's behaviour.
FIXED: dict[str, Any] = {
    "min_lr_ratio": 0.0,  # its cosine schedule decays to 0
    "save_final": False,  # run_training never asks for its save_last
}
