"""The run's story as MLflow tags, beside the scalars (``ilab-watch --mlflow``): every
checkpoint with its step, its reports and what became of it (removed ones too, with why),
every control command (applied at which step or refused, who sent it), the best checkpoint,
and the run's end with its status and reason as the run's description, so that a stopped
run does not read as plainly "Finished".

Tags, by checkpoint name (``step-000040``): ``checkpoint.<name>`` its path (as before),
``checkpoint.<name>.step``, ``checkpoint.<name>.report`` (the latest: metrics and source),
``checkpoint.<name>.removed`` (the reason, at which step); by command id:
``control.<id>``; for the run: ``ilab.best_checkpoint``, ``ilab.best``, ``ilab.stop_source`` (the
sender's kind in ``status``'s words), ``ilab.stopped_by`` (its source) and ``mlflow.note.content`` (shown as the run's description in MLflow's UI).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from journal.views.stops import stop_kind

#: MLflow's limit on a tag key's length is 250; values are cut to the exporter's limit.
_MAX_KEY = 250


def _name(path: Any) -> str | None:
    return Path(path).name if isinstance(path, str) and path else None


def _metrics(metrics: Any) -> str:
    if not isinstance(metrics, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in metrics.items())


def save_tags(step: int, data: dict[str, Any]) -> dict[str, str]:
    """A save: the checkpoint's step (its path is tagged by the exporter as before)."""
    name = _name(data.get("checkpoint_path"))
    return {f"checkpoint.{name}.step": str(step)} if name else {}


def removed_tags(step: int, data: dict[str, Any]) -> dict[str, str]:
    """A ``checkpoint_removed``: the checkpoint (a replay may never deliver its save: it is
    gone) and why it went."""
    path = data.get("checkpoint_path")
    name = _name(path)
    if not name:
        return {}
    why = data.get("reason") or "removed"
    return {
        f"checkpoint.{name}": str(path),
        f"checkpoint.{name}.removed": f"{why} (at step {step})",
    }


def report_tags(data: dict[str, Any]) -> dict[str, str]:
    """A report: its metrics and source on the checkpoint it is about."""
    name = _name(data.get("checkpoint_path"))
    if not name:
        return {}
    text = _metrics(data.get("metrics"))
    if data.get("source"):
        text += f" from {data['source']}"
    return {f"checkpoint.{name}.report": text}


def control_tags(data: dict[str, Any]) -> dict[str, str]:
    """A control record: the command, its verdict and who sent it."""
    command, cid = data.get("command"), data.get("id")
    if command is None:  # an inbox file refused (journal/rundir/inbox.py): said as such
        return {"ilab.refused_file": str(data.get("reason"))}
    if data.get("accepted") is False:
        verdict = f"{command} refused: {data.get('error') or data.get('reason') or ''}".rstrip()
    else:
        verdict = f"{command} applied at step {data.get('applied_at_step')}"
    verdict += f" from {data.get('source') or '?'}"
    if data.get("reason") and data.get("accepted") is not False:
        verdict += f": {data['reason']}"
    tags = {f"control.{cid}"[:_MAX_KEY]: verdict}
    if command == "stop" and data.get("accepted") is not False:
        tags.update(stop_tags(data.get("source")))
    return tags


def stop_tags(source: str | None) -> dict[str, str]:
    """Who stopped the run: ``ilab.stop_source`` in ``status``'s words (``eval``,
    ``operator``, ...; journal/views/stops.py), ``ilab.stopped_by`` the command's source."""
    return {"ilab.stop_source": stop_kind(source), "ilab.stopped_by": str(source or "?")}


def end_tags(status: str, data: dict[str, Any]) -> dict[str, str]:
    """``train_end``: the best checkpoint, and the status with its reason as the run's
    description (MLflow's run status has no "stopped": FINISHED alone would hide it)."""
    tags: dict[str, str] = {}
    note = f"{status}"
    if data.get("reason"):
        note += f": {data['reason']}"
    best = data.get("best_checkpoint")
    if isinstance(best, dict) and best.get("checkpoint_path"):
        tags["ilab.best_checkpoint"] = str(best["checkpoint_path"])
        tags["ilab.best"] = f"{best.get('metric')}={best.get('value')} at step {best.get('step')}"
        note += f"\n\nbest checkpoint: {best['checkpoint_path']} ({tags['ilab.best']})"
    if data.get("command_source"):
        tags.update(stop_tags(data["command_source"]))
    tags["mlflow.note.content"] = note
    return tags
