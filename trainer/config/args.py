"""Training and launch configuration (pydantic), shared by ``ilab-train`` and ``run_training``.
Callback fields (``on_<event>``, ``callbacks``) never travel to the torchrun workers: the
launching process runs them through the embedded watcher (WorkerConfig: plain data only)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, SecretStr, model_validator

from journal.record.events import CALLBACK_EVENTS
from journal.remote.store import RESTORE_FROM_HELP
from journal.views.best import MetricGoal
from trainer.config.fields import (
    HangAfter,
    Seed,
    Settings,
    TrackerSettings,
    checked_by,
    data_file_problem,
    parse_profile_steps,
)
from trainer.config.model import ModelConfig

CallbackSpec = Callable[..., Any] | str
CallbackField = CallbackSpec | list[CallbackSpec] | None


class TrainingArgs(Settings):
    """Everything a training run needs. See ``ilab-train --help`` for the CLI names."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    ckpt_dir: Path = Field(description="Checkpoints, journal.jsonl, control/ and logs/ go here.")
    data_path: Path | None = Field(
        None,
        description="Training JSONL: input_ids (+labels), text, or chat messages (tokenized "
        "with the model's chat template: needs a model path).",
    )
    val_data_path: Path | None = Field(None, description="Validation JSONL.")
    validation_split: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Hold out this fraction of the training data and evaluate on it every "
        "--eval-every steps: rounded up to whole samples, chosen by the seed, the same on every "
        "rank and resume; 0 holds nothing out; not together with --val-data.",
    )
    demo: bool = Field(
        False,
        description="Generated arithmetic demo data instead of --data (the built-in model "
        "unless --model-path).",
    )
    demo_samples: int = Field(6000, ge=64, description="Generated demo training samples.")

    model: ModelConfig = Field(default_factory=ModelConfig)
    model_path: Path | None = Field(
        None,
        description="Local Hugging Face causal LM directory, or a .gguf file (converted once "
        "into CKPT_DIR/model). Needs the 'hf' extra ('llm' for .gguf); nothing is downloaded.",
    )
    train_on_all_tokens: bool = Field(
        False, description="Chat data: loss on every token (default: only the assistant's replies)."
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each block's activations in backward: less memory, ~1/3 more "
        "compute.",
    )

    lora_rank: int | None = Field(
        None,
        ge=1,
        description="Train LoRA adapters of this rank (peft) on a frozen --model-path model "
        "(default: full fine-tune).",
    )
    lora_alpha: float = Field(32.0, gt=0, description="LoRA scaling numerator (alpha / rank).")
    lora_dropout: float = Field(0.1, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    lora_target_modules: list[str] | None = Field(
        None,
        description="Module names that get adapters, comma-separated, e.g. q_proj,v_proj "
        "(default: peft's choice for the architecture).",
    )
    lora_merge: bool = Field(
        False,
        description="LoRA: export the base model with the adapters merged in (default: the "
        "adapter alone, in peft's format).",
    )

    num_epochs: int = Field(1, ge=1, description="Epochs over the data.")
    max_steps: int | None = Field(None, ge=1, description="Stop after this many optimizer steps.")
    effective_batch_size: int = Field(
        64, ge=1, description="Effective batch size: samples per optimizer step over all ranks."
    )
    max_batch_len: int = Field(2048, ge=8, description="Token budget of one micro-batch per rank.")
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (AdamW).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    adam_betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW's beta1 and beta2, each in [0, 1)."
    )
    adam_eps: float = Field(1e-8, gt=0, description="AdamW's epsilon.")
    warmup_steps: int = Field(10, ge=0, description="Linear warmup steps before cosine decay.")
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Where the cosine decay ends, as a fraction of the peak lr."
    )
    max_grad_norm: float = Field(1.0, gt=0, description="Gradients are clipped to this norm.")
    seed: Seed = Field(42, description="Seed for init and data order, 0 to 2**32 - 1.")

    log_every: int = Field(1, ge=1, description="Steps between log records.")
    eval_every: int | None = Field(
        None, ge=1, description="Steps between validations (default: never)."
    )
    save_every: int | None = Field(
        None, ge=1, description="Steps between checkpoints (default: epoch end and final)."
    )
    save_samples: int | None = Field(
        None,
        ge=1,
        description="Checkpoint every N training samples, as InstructLab counts them: at the "
        "first step boundary at or past each multiple of N (beside --save-every).",
    )
    save_at_epoch_end: bool = Field(True, description="Checkpoint at the end of every epoch.")
    save_final: bool = Field(True, description="Checkpoint at the end unless one was just saved.")
    async_save: bool = Field(
        True,
        description="Write the sharded checkpoint in the background: training blocks only "
        "while the state is copied to host memory (its save record comes when it is complete).",
    )
    save_hf: bool = Field(
        True, description="Also write a consolidated model (safetensors) at a save."
    )
    keep_last_n: int | None = Field(
        3, ge=1, description="Newest checkpoints to keep (null in a config file keeps all)."
    )
    max_leased_checkpoints: int | None = Field(
        None,
        ge=1,
        description="Before each scheduled save, wait while N or more of this run's checkpoints "
        "are leased (ilab-watch leases each save it delivers, ilab-journal lease counts too): "
        "training stays at most N saves ahead of them. A control command, a signal or 3/4 of "
        "--pg-timeout ends the wait (default: no pacing).",
    )
    keep_best: Annotated[str | None, checked_by(MetricGoal.parse)] = Field(
        None,
        description="Also keep the best checkpoint by a reported or evaluate metric, as "
        "METRIC:max|min, e.g. accuracy:max or val_loss:min.",
    )
    resume: Literal["auto", "never"] = Field(
        "auto",
        description="auto: continue the journal's run from its latest complete checkpoint "
        "in the checkpoint dir; never: start a new run from scratch (refused where the dir "
        "holds checkpoints: give a new --ckpt-dir).",
    )

    restore_from: str | None = Field(None, description=RESTORE_FROM_HELP, min_length=1)
    journal_detail: Literal["step", "microbatch", "off"] = Field(
        "step",
        description="step: every event but the per-micro-batch ones; microbatch: those too; "
        "off: no journal.",
    )
    report_to: list[Literal["tensorboard", "mlflow", "wandb"]] = Field(
        default_factory=list,
        description="Experiment trackers fed from the journal while training, comma-separated: "
        "tensorboard (CKPT_DIR/tensorboard), mlflow ($MLFLOW_TRACKING_URI), wandb (offline "
        "unless WANDB_MODE=online; CKPT_DIR/wandb). One that cannot work is a warning; "
        "training goes on.",
    )
    tracker_settings: TrackerSettings = Field(
        default_factory=dict,
        description="Where report_to's trackers write (TRACKER_SETTINGS keys; the launcher's "
        "exporters read it).",
    )
    mixed_precision: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="Compute dtype; weights, grads and optimizer state stay fp32 (auto: bf16 "
        "on GPUs, fp32 on CPU).",
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto", description="Collectives backend (auto: NCCL with GPUs, else gloo)."
    )

    # -- scale: what a multi-GPU fine-tune of a large model needs (docs/gpu.md) ------------
    max_seq_len: int | None = Field(
        None,
        ge=4,
        description="Longest sample in tokens; longer ones are truncated (default: the "
        "model's context: max_position_embeddings of an HF model, model.max_seq_len of the "
        "built-in one).",
    )
    sharding: Literal["full", "grad_op", "hybrid", "replicate"] = Field(
        "full",
        description="full: params, grads and optimizer state sharded over all ranks; "
        "grad_op: params stay gathered between forward and backward; hybrid: shard within a "
        "node, replicate across nodes; replicate: a whole copy per rank, DDP (small models).",
    )
    reduce_grads: Literal["every_micro_batch", "last_micro_batch"] = Field(
        "every_micro_batch",
        description="Reduce-scatter gradients after every micro-batch (grads stay sharded: "
        "the memory of a large model) or only after the last one (fewer collectives, "
        "unsharded grads held: small models only).",
    )
    model_init: Literal["meta", "full"] = Field(
        "meta",
        description="meta: build on the meta device, shard, then load the weights sharded "
        "(rank 0 reads them and broadcasts); full: every rank builds the whole model first.",
    )
    export_every: int | None = Field(
        None,
        ge=1,
        description="Write the consolidated model only at saves whose step is a multiple of "
        "N, and at the final save (default: every save); never at a save on interrupt.",
    )
    export_dtype: Literal["auto", "bf16", "fp32"] = Field(
        "auto",
        description="dtype of the consolidated model (auto: what the HF config declares; "
        "fp32 for the built-in model).",
    )
    packing: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Padding-free micro-batches: whole samples back to back in one row "
        "(position ids restart per sample, attention stays within each sample) and "
        "max_batch_len counts real tokens (auto: on with CUDA + bf16, where variable-length "
        "flash attention runs).",
    )
    fused_loss: Literal["auto", "off", "chunked", "liger"] = Field(
        "auto",
        description="Output layer + cross-entropy without full-vocabulary fp32 logits: "
        "chunked (torch) or liger (liger-kernel, CUDA); off: plain logits; auto: liger where "
        "installed on CUDA, else chunked.",
    )
    compile: Literal["auto", "on", "off"] = Field(
        "auto",
        description="torch.compile each transformer block (regional compilation; auto: on "
        "with CUDA).",
    )
    profile_steps: Annotated[str | None, checked_by(parse_profile_steps)] = Field(
        None,
        description="Profile steps A to B (A:B, or N for one step) with torch.profiler on "
        "every rank: a Chrome trace and a table of the costliest ops in logs/profile/ (and, "
        "on a GPU, how busy the device was).",
    )
    pg_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Seconds a collective may wait, e.g. for rank 0's export at a save.",
    )

    # -- hangs, deaths and restarts: the launcher's guard (docs/alerts.md) -------------------
    hang_after: HangAfter = Field(
        None,
        description="Raise a hang alert (with every local rank's py-spy stack) after this "
        "many seconds without step progress outside a declared phase (a lease wait, a save, "
        "an eval, a profile's trace, the first step); auto: 3x the 90th percentile of this attempt's last 100 "
        "step times, plus 4s (default: no hang detection).",
    )
    hang_action: Literal["report", "abort"] = Field(
        "report",
        description="What a hang does: report (the alert only) or abort (the alert, then "
        "SIGTERM and SIGKILL of the attempt's ranks; journaled as a hang). Needs --hang-after.",
    )
    max_restarts: int = Field(
        0,
        ge=0,
        description="Relaunch a failed or aborted attempt up to N times; each resumes from "
        "the run's newest checkpoint.",
    )
    max_no_progress_attempts: int = Field(
        3,
        ge=1,
        description="With --max-restarts: relaunch no more (exit 4) once this many attempts "
        "in a row failed without saving a new checkpoint, a crash loop (docs/alerts.md).",
    )
    # SecretStr: a webhook's token never reaches the workers' config or train_begin's
    notify: list[SecretStr] = Field(
        default_factory=list,
        description="Tell this apprise URL (slack://, workflows:// for Teams, mailto://, "
        "ntfy://, pagerduty://, json://HOST:PORT/...) when the run goes wrong: a hang, a death, "
        "a failure, a divergence, a stop (docs/alerts.md). Repeatable. @FILE: the URLs in "
        "FILE; none given: those in $ILAB_NOTIFY. A URL holds secrets and every local user "
        "sees a command line (ps): prefer @FILE or $ILAB_NOTIFY.",
    )
    notify_when: list[str] = Field(
        default_factory=list,
        description="Also alert, once per attempt, when this check expression holds, e.g. "
        "'best(accuracy) >= 0.9' (ilab-journal check's grammar). Repeatable.",
    )
    notify_on: str | None = Field(
        None,
        description="The kinds that alert: a comma list of hang, recovered, died, failed, "
        "diverged, stopped, completed, guard_stopped, or all (default: all but completed).",
    )

    # -- flat callback API (never sent to the workers) --------------------------------------
    callbacks: list[Any] = Field(default_factory=list, exclude=True)
    callback_grace_s: float = Field(
        120.0, ge=0, description="Total time run_training waits for callbacks after train_end."
    )
    on_train_begin: CallbackField = Field(None, exclude=True)
    on_epoch_begin: CallbackField = Field(None, exclude=True)
    on_step_begin: CallbackField = Field(None, exclude=True)
    on_before_forward: CallbackField = Field(None, exclude=True)
    on_after_forward: CallbackField = Field(None, exclude=True)
    on_before_backward: CallbackField = Field(None, exclude=True)
    on_after_backward: CallbackField = Field(None, exclude=True)
    on_before_optimizer_step: CallbackField = Field(None, exclude=True)
    on_after_optimizer_step: CallbackField = Field(None, exclude=True)
    on_log: CallbackField = Field(None, exclude=True)
    on_evaluate: CallbackField = Field(None, exclude=True)
    on_save: CallbackField = Field(None, exclude=True)
    on_step_end: CallbackField = Field(None, exclude=True)
    on_epoch_end: CallbackField = Field(None, exclude=True)
    on_train_end: CallbackField = Field(None, exclude=True)
    on_control: CallbackField = Field(None, exclude=True)
    on_report: CallbackField = Field(None, exclude=True)
    on_checkpoint_removed: CallbackField = Field(None, exclude=True)

    @model_validator(mode="after")
    def _check(self) -> TrainingArgs:
        if self.demo == (self.data_path is not None):  # neither, or both (--demo replaces data)
            what = "both data_path and demo given" if self.demo else "no training data"
            raise ValueError(
                f"{what}: give data_path (ilab-train --data FILE.jsonl) or demo=True (--demo)"
            )
        for path, what in ((self.data_path, "training"), (self.val_data_path, "validation")):
            if path is not None and (why := data_file_problem(Path(path), f"{what} data file")):
                raise ValueError(why)
        if self.validation_split and self.val_data_path is not None:
            raise ValueError("give validation_split or val_data_path, not both")
        if not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"adam_betas must each be in [0, 1), got {self.adam_betas}")
        if self.model_path is not None:
            mp = Path(self.model_path)
            if not mp.exists():
                raise ValueError(f"model_path {mp} does not exist")
            if mp.is_file() and mp.suffix != ".gguf":
                raise ValueError(f"model_path {mp} must be a model directory or a .gguf file")
            if mp.is_dir() and not (mp / "config.json").is_file():
                # found here, not after the workers have started and loaded transformers
                raise ValueError(
                    f"model_path {mp} has no config.json: give a Hugging Face model directory "
                    "(as save_pretrained writes it) or a .gguf file"
                )
        if self.lora_rank is not None and self.model_path is None:
            raise ValueError(
                "lora_rank needs model_path (a Hugging Face model): the built-in model has no "
                "LoRA support"
            )
        if "lm_head" in (self.lora_target_modules or []):
            raise ValueError(
                "lora_target_modules: lm_head cannot take an adapter here (the trainer fuses "
                "it with the loss)"
            )
        if self.hang_action == "abort" and self.hang_after is None:
            raise ValueError("--on-hang abort needs --hang-after SECONDS|auto")
        if self.max_seq_len is not None and self.model_path is None:
            # the built-in model's context is its position table: they are one setting
            self.model = self.model.model_copy(update={"max_seq_len": self.max_seq_len})
        return self

    def hooks(self) -> dict[str, list[CallbackSpec]]:
        """The flat ``on_<event>`` fields as ``{event: [callable or command, ...]}``."""
        hooks = {event: getattr(self, f"on_{event}") for event in CALLBACK_EVENTS}
        return {
            e: list(v) if isinstance(v, list) else [v] for e, v in hooks.items() if v is not None
        }

    def has_callbacks(self) -> bool:
        return bool(self.callbacks) or bool(self.hooks())

    def data_dict(self) -> dict[str, Any]:
        """The plain-data fields (callbacks excluded) as JSON types."""
        return dict(json.loads(self.model_dump_json()))


class ConfigError(ValueError):
    """The configuration cannot work on this machine (one clear line, before launching).

    Raised by the launcher's checks in :mod:`trainer.launch.preflight`."""
