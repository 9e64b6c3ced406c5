"""The record format: envelope, event names and payload models (docs/journal-format.md).

The models document and validate the contract. The hot paths (writer, reader) work on plain
dicts for speed; use :func:`parse_record` when you want typed access. Every model allows
extra fields and unknown events parse as a generic payload, so newer writers never break
older readers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from journal.record.events import (  # noqa: F401  (re-exported: the contract lives in one place)
    CONTROL_COMMANDS,
    DURABLE_EVENTS,
    END_STATUSES,
    ENVELOPE_FIELDS,
    EVENTS,
    LIFECYCLE_EVENTS,
    MICROBATCH_EVENTS,
    SCHEMA_VERSION,
    AlertKind,
)


class _Open(BaseModel):
    """Base for every model: unknown fields pass through (forward compatibility)."""

    model_config = ConfigDict(extra="allow")


class Payload(_Open):
    """Payload of an event with no required fields (also used for unknown events)."""


class BatchMetrics(_Open):
    total_samples: int
    total_length: int
    num_loss_counted_tokens: int
    accumulated_loss: float
    grad_accum_steps: int
    num_minibatches: int


class TrainBeginData(_Open):
    config: dict[str, Any]
    world_size: int
    nnodes: int
    device_type: str
    journal_detail: Literal["step", "microbatch"]
    resumed_from: str | None
    total_steps: int
    hostname: str
    pid: int
    versions: dict[str, str]


class LogData(_Open):
    """ilab-train writes every field; bridges from other trainers (HF Trainer, Accelerate)
    write what those trainers know, so only ``loss`` and ``lr`` are required."""

    loss: float | None = Field(description="average loss across ranks (per loss-counted token)")
    lr: float | None
    grad_norm: float | None = None
    elapsed_time: float | None = Field(None, description="wall time of the step in seconds")
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    samples_seen: int | None = None
    batch_metrics: BatchMetrics | None = None
    cuda_mem_allocated: int | None = Field(None, description="bytes; null on CPU")
    cuda_max_mem_allocated: int | None = Field(
        None, description="peak bytes allocated during the step; null on CPU"
    )
    loss_finite: bool | None = Field(
        None, description="false when the loss was NaN/Inf (written as null)"
    )


class EvaluateData(_Open):
    val_loss: float | None
    val_num_tokens: int | None = Field(None, description="ilab-train; bridges may omit it")
    duration: float | None = None


class SaveData(_Open):
    checkpoint_path: str
    kind: list[Literal["full_state", "hf"]]
    duration: float | None
    hf_path: str | None = Field(None, description="consolidated model dir, when kind has 'hf'")
    export: Literal["full", "adapter", "merged"] | None = Field(
        None, description="what hf_path holds: the whole model, a LoRA adapter, or merged"
    )
    trigger: str | None = Field(None, description="interval, epoch_end, final, control, interrupt")
    export_skipped: str | None = Field(
        None, description="why no consolidated model was written (interrupt, export_every)"
    )
    lease_wait_s: float | None = Field(
        None,
        description="with max_leased_checkpoints: seconds rank 0 waited for leases before "
        "this save (0 when it did not wait); absent without it",
    )


class BestCheckpointData(_Open):
    checkpoint_path: str
    metric: str
    value: float
    step: int | None = None


class TrainEndData(_Open):
    status: Literal["completed", "stopped", "failed", "interrupted"]
    reason: str | None = None
    final_checkpoint: str | None = None
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    journal: dict[str, Any] | None = Field(None, description="measured journal append cost")
    best_checkpoint: BestCheckpointData | None = Field(
        None, description="with keep_best: the best checkpoint at the end and its value"
    )
    restart: int | None = Field(None, description="max_restarts: the relaunches before it")
    restarts_left: int | None = Field(
        None, description="max_restarts, failed: relaunches left after it (0: none follows)"
    )
    relaunch: str | None = Field(None, description="max_restarts, failed: what follows, in words")
    first_failure: dict[str, Any] | None = Field(
        None,
        description="workers ended without train_end: the rank torchrun saw end first (rank, "
        "pid, exitcode, signal, log); error_message then ends with its log's last lines",
    )


class ControlData(_Open):
    command: str | None
    id: str | None
    source: str | None = None
    accepted: bool
    reason: str | None = None
    applied_at_step: int | None = None


class ReportData(_Open):
    id: str = Field(description="unique per report; a report is journaled at least once")
    checkpoint_path: str | None = Field(description="the checkpoint the metrics belong to")
    step: int | None = Field(description="that checkpoint's step")
    metrics: dict[str, float | int | bool | str | None]
    source: str | None = None
    delivery_id: str | None = Field(None, description="the watcher delivery that reported it")
    reported_at: float = Field(description="Unix time the reporter wrote it")


class JobData(_Open):
    id: str = Field(description="unique per record; a job record is journaled at least once")
    job_id: str = Field(description="the scheduler's id of the job (Slurm: the sbatch job id)")
    scheduler: str = Field(description="slurm or local")
    state: str = Field(description="PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, ...")
    node: str | None = Field(None, description="where it runs or ran")
    exit_code: int | None = Field(None, description="once it ended")
    log_path: str | None = None
    checkpoint_path: str | None = Field(description="the checkpoint of the delivered save")
    step: int | None = None
    delivery_id: str = Field(description="the watcher delivery the job runs")
    hook: str | None = None
    attempt: int | None = Field(None, description="the delivery's attempt (1, then retries)")
    source: str | None = None
    reported_at: float


class AlertData(_Open):
    """A run went wrong (or a ``--notify-when`` condition held): journaled once, at once,
    whether or not its targets answer; what became of telling them is ``alert_told``."""

    id: str = Field(description="unique per alert; its evidence lies in alerts/<id>/")
    kind: AlertKind
    step: int | None = Field(description="the step the alert is about (null: unknown)")
    attempt: int | None = Field(None, description="the attempt it is about")
    message: str = Field(description="what was seen, one line")
    evidence: list[str] = Field(
        default_factory=list, description="evidence files, relative to the run dir"
    )
    missing: list[str] = Field(
        default_factory=list, description="one line per piece of evidence not captured"
    )
    condition: str | None = Field(None, description="kind condition: the --notify-when text")
    targets: list[str] = Field(
        default_factory=list,
        description="the --notify targets being told, by scheme and host only (no secrets)",
    )
    run: str | None = Field(None, description="the run as the watcher names it (dir or URI)")
    host: str | None = Field(None, description="the host of the watcher that raised it")
    source: str | None = Field(None, description="who raised it, e.g. ilab-watch")
    resolves: str | None = Field(None, description="kind recovered: the hang alert's id")
    raised_at: float = Field(description="Unix time it was raised")


class AlertToldData(_Open):
    """What became of telling an alert's targets (after every target was told, or given up)."""

    id: str = Field(description="the alert's id")
    told: list[str] = Field(description="targets that took it")
    failed: list[dict[str, Any]] = Field(
        default_factory=list,
        description="targets never told: {target, tries, error} (error without secrets)",
    )
    told_at: float = Field(description="Unix time the outcome was known")


class CheckpointRemovedData(_Open):
    checkpoint_path: str
    reason: str = Field(description="why, e.g. 'rotation: keep_last_n=3'")


class CheckpointKeptData(_Open):
    checkpoint_path: str
    reason: str = Field(description="why it was not deleted, e.g. 'leased'")


class JournalGapData(_Open):
    dropped: int = Field(description="records lost while the journal could not be written")
    first_seq: int
    last_seq: int
    error: str
    cause: str | None = Field(
        default=None,
        description="absent after I/O errors; journal_deleted or journal_replaced: the file was "
        "deleted or replaced during the run and this record starts the new one",
    )


PAYLOAD_MODELS: dict[str, type[_Open]] = {
    "train_begin": TrainBeginData,
    "log": LogData,
    "evaluate": EvaluateData,
    "save": SaveData,
    "train_end": TrainEndData,
    "control": ControlData,
    "report": ReportData,
    "checkpoint_removed": CheckpointRemovedData,
    "journal_gap": JournalGapData,
    "checkpoint_kept": CheckpointKeptData,
    "job": JobData,
    "alert": AlertData,
    "alert_told": AlertToldData,
}


class RecordModel(_Open):
    """One journal line as the schema holds it: the envelope around an event payload (what
    the readers hand out is :class:`journal.record.record.Record`)."""

    v: int = Field(ge=1, description="record format version")
    seq: int = Field(ge=0, description="0-based, strictly increasing over the whole file")
    run_id: str
    attempt: int = Field(ge=1, description="1 for the first launch, +1 for each resume")
    ts: float = Field(description="Unix time in seconds")
    event: str
    step: int = Field(ge=0, description="global optimizer step; 0 before training starts")
    epoch: int = Field(ge=0)
    samples_seen: int = Field(ge=0)
    data: dict[str, Any] = Field(default_factory=dict)


class ParsedRecord(BaseModel):
    """A validated record with its payload parsed into the event's model."""

    record: RecordModel
    payload: _Open


def parse_record(obj: Mapping[str, Any]) -> ParsedRecord:
    """Validate a raw record dict; raises ``pydantic.ValidationError`` on a bad record."""
    record = RecordModel.model_validate(obj)
    model = PAYLOAD_MODELS.get(record.event, Payload)
    return ParsedRecord(record=record, payload=model.model_validate(record.data))


def json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of one journal record, with per-event payload rules."""
    schema = RecordModel.model_json_schema()
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    rules = []
    for event, model in PAYLOAD_MODELS.items():
        sub = model.model_json_schema(ref_template="#/$defs/{model}")
        defs.update(sub.pop("$defs", {}))
        defs[model.__name__] = sub
        rules.append(
            {
                "if": {"properties": {"event": {"const": event}}},
                "then": {"properties": {"data": {"$ref": f"#/$defs/{model.__name__}"}}},
            }
        )
    schema["allOf"] = rules
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "ilab-journal record"
    schema["description"] = (
        f"One line of journal.jsonl, format version {SCHEMA_VERSION}. Known events: "
        + ", ".join(EVENTS)
        + ". Unknown events and fields are allowed."
    )
    return schema
