"""The run's story as MLflow tags, beside the scalars (``ilab-watch --mlflow``): every
checkpoint with its step, its reports and what became of it (removed ones too, with why),
every control command (applied at which step or refused, who sent it), the best checkpoint,
and the run's end with its status and reason as the run's description, so that a stopped
run does not read as plainly "Finished".

Checkpoints, and the best, come from the run's fold (journal/views/fold.py), as ``status``
and ``query --best`` say them: a checkpoint by its canonical path, the best by the run's
``keep_best`` from every report, those that land after ``train_end`` too.

Tags, by checkpoint name (``step-000040``): ``checkpoint.<name>`` its canonical path,
``checkpoint.<name>.step``, ``checkpoint.<name>.report`` (the latest: metrics and source),
``checkpoint.<name>.removed`` (the reason, at which step); by command id:
``control.<id>``; for the run: ``ilab.best_checkpoint``, ``ilab.best``, ``ilab.stop_source`` (the
sender's kind in ``status``'s words), ``ilab.stopped_by`` (its source) and ``mlflow.note.content`` (shown as the run's description in MLflow's UI).
"""

from __future__ import annotations

from typing import Any

from journal.record.fields import accepted
from journal.views.best import BestCheckpoint
from journal.views.fold import CheckpointFate
from journal.views.summary import RunSummary
from watcher.exporters.base import stop_said

#: MLflow's limit on a tag key's length is 250; values are cut to the exporter's limit.
_MAX_KEY = 250


def _metrics(metrics: Any) -> str:
    if not isinstance(metrics, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in metrics.items())


def save_tags(fate: CheckpointFate, step: int) -> dict[str, str]:
    """A save: the checkpoint's path (the fold's canonical spelling, so a relative and an
    absolute path of one checkpoint are one tag) and its step."""
    return {f"checkpoint.{fate.name}": fate.path, f"checkpoint.{fate.name}.step": str(step)}


def removed_tags(fate: CheckpointFate, step: int, data: dict[str, Any]) -> dict[str, str]:
    """A ``checkpoint_removed``: the checkpoint (a replay may never deliver its save: it is
    gone) and why it went."""
    why = data.get("reason") or "removed"
    return {
        f"checkpoint.{fate.name}": fate.path,
        f"checkpoint.{fate.name}.removed": f"{why} (at step {step})",
    }


def report_tags(fate: CheckpointFate, data: dict[str, Any]) -> dict[str, str]:
    """A report: its metrics and source on the checkpoint it is about."""
    text = _metrics(data.get("metrics"))
    if data.get("source"):
        text += f" from {data['source']}"
    return {f"checkpoint.{fate.name}.report": text}


def control_tags(data: dict[str, Any]) -> dict[str, str]:
    """A control record: the command, its verdict and who sent it (who stopped the run is
    the fold's, at ``train_end``: :func:`end_tags`)."""
    command, cid = data.get("command"), data.get("id")
    if command is None:  # an inbox file refused (journal/rundir/inbox.py): said as such
        return {"ilab.refused_file": str(data.get("reason"))}
    if not accepted(data):
        verdict = f"{command} refused: {data.get('error') or data.get('reason') or ''}".rstrip()
    else:
        verdict = f"{command} applied at step {data.get('applied_at_step')}"
    verdict += f" from {data.get('source') or '?'}"
    if data.get("reason") and accepted(data):
        verdict += f": {data['reason']}"
    return {f"control.{cid}"[:_MAX_KEY]: verdict}


def end_tags(summary: RunSummary) -> dict[str, str]:
    """``train_end``: who stopped the run, as the fold says it (``status``'s stop source: a
    hang abort, an eval's stop, ...); the best and the description: :func:`best_tags`,
    :func:`note`, from the same fold."""
    source, by = stop_said(summary)  # "": no stop (a later attempt completed): removed
    return {"ilab.stop_source": source, "ilab.stopped_by": by}


def best_tags(best: BestCheckpoint | None) -> dict[str, str]:
    """The best checkpoint by the run's ``keep_best``, as the run's fold says now (reports
    that landed after ``train_end`` included); empty values (tags to remove) when there is
    none."""
    if best is None:
        return {"ilab.best_checkpoint": "", "ilab.best": ""}
    return {
        "ilab.best_checkpoint": best.checkpoint_path,
        "ilab.best": f"{best.metric}={best.value} at step {best.step}",
    }


def note(status: str, reason: str | None, best: BestCheckpoint | None) -> dict[str, str]:
    """The status with its reason and the best checkpoint, as the run's description
    (MLflow's run status has no "stopped": FINISHED alone would hide it)."""
    text = f"{status}: {reason}" if reason else status
    if best is not None:
        text += f"\n\nbest checkpoint: {best.checkpoint_path} ({best_tags(best)['ilab.best']})"
    return {"mlflow.note.content": text}
