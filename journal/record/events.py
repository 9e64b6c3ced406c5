"""Event names and constants of the record format (no heavy imports: the CLI hot path uses it)."""

from __future__ import annotations

from typing import Literal, get_args

SCHEMA_VERSION = 1

#: Lifecycle events in the order they fire within a run (hook name = ``on_`` + event).
LIFECYCLE_EVENTS: tuple[str, ...] = (
    "train_begin",
    "epoch_begin",
    "step_begin",
    "before_forward",
    "after_forward",
    "before_backward",
    "after_backward",
    "before_optimizer_step",
    "after_optimizer_step",
    "log",
    "evaluate",
    "save",
    "step_end",
    "epoch_end",
    "train_end",
)
#: Recorded only with ``journal_detail="microbatch"``.
MICROBATCH_EVENTS: frozenset[str] = frozenset(
    {"before_forward", "after_forward", "before_backward", "after_backward"}
)
#: Records about the run rather than a point of the loop: applied control commands, results
#: reported for a checkpoint, and checkpoints deleted by rotation.
RESULT_EVENTS: tuple[str, ...] = ("control", "report", "checkpoint_removed")
#: Events a callback can hook, as ``on_<event>`` (TrainingArgs fields, TrainerCallback
#: methods, ``ilab-watch --on-<event>``).
CALLBACK_EVENTS: tuple[str, ...] = (*LIFECYCLE_EVENTS, *RESULT_EVENTS)
#: What a watcher's alerts journal (journal/channels/alerts.py): ``alert``, a run went wrong
#: (hang, died, failed, diverged, stopped, a ``--notify-when`` condition; completed when
#: asked), and ``alert_told``, which ``--notify`` targets were told of it and which not.
ALERT_EVENTS: tuple[str, ...] = ("alert", "alert_told")
#: What an alert is about. ``condition``: a user's ``--notify-when`` expression held;
#: ``recovered``: a hang cleared (steps go on); ``guard_stopped``: a guard ended before its run.
AlertKind = Literal[
    "hang",
    "died",
    "failed",
    "diverged",
    "stopped",
    "completed",
    "condition",
    "recovered",
    "guard_stopped",
]
ALERT_KINDS: tuple[str, ...] = get_args(AlertKind)
#: Every event name a writer of this version produces (``checkpoint_kept``: a bridge kept a
#: checkpoint its trainer's rotation asked to delete, because it is leased; ``job``: a
#: scheduler job that ran a watcher delivery changed state, see journal/channels/jobs.py).
EVENTS: tuple[str, ...] = (
    *CALLBACK_EVENTS,
    "journal_gap",
    "checkpoint_kept",
    "job",
    *ALERT_EVENTS,
)
#: Records that others than the trainer append after its ``train_end``: a late eval's
#: ``report``, a scheduler ``job``, a refused inbox file's ``control``, ``prune``'s
#: ``checkpoint_removed``, a watcher's alerts. They do not make an ended run a running one.
AFTER_END_EVENTS = frozenset(
    {"report", "job", "control", "checkpoint_removed", "checkpoint_kept", "journal_gap"}
    | set(ALERT_EVENTS)
)

#: Events the writer fsyncs: consumers act on them (load a checkpoint, end a job, page
#: someone).
DURABLE_EVENTS: frozenset[str] = frozenset(
    {"save", "train_end", "journal_gap", "job", *RESULT_EVENTS, *ALERT_EVENTS}
)
#: Final states of a run, as written in ``train_end.data.status``.
END_STATUSES: tuple[str, ...] = ("completed", "stopped", "failed", "interrupted")
#: Commands accepted on the control channel (docs/python-api.md).
CONTROL_COMMANDS: tuple[str, ...] = ("stop", "abort", "save", "evaluate", "log")

ENVELOPE_FIELDS: tuple[str, ...] = (
    "v",
    "seq",
    "run_id",
    "attempt",
    "ts",
    "event",
    "step",
    "epoch",
    "samples_seen",
    "data",
)
