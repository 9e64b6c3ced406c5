"""The experiment trackers by name: the one place that knows which exporter each
``--report-to`` / ``ilab-watch --mlflow/--wandb/--tensorboard`` name stands for. The
exporters import :mod:`watcher.export` (their base); this module imports them, lazily, so
a tracker's package is loaded only when it is asked for."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from watcher.callbacks import CallbackSpecError
from watcher.export import MetricsExport

#: ``--report-to`` / ``TrainingArgs.report_to`` names
TRACKERS = ("tensorboard", "mlflow", "wandb")


def make_exporter(
    name: str,
    ckpt_dir: Path,
    *,
    tensorboard_dir: Path | None = None,
    mlflow_uri: str | None = None,
    mlflow_log_artifacts: bool = False,
) -> MetricsExport:
    """The exporter called ``name`` (one of :data:`TRACKERS`) for the run in ``ckpt_dir``.

    TensorBoard writes to ``tensorboard_dir`` (default ``ckpt_dir/tensorboard``); MLflow
    to ``mlflow_uri`` (default ``$MLFLOW_TRACKING_URI``); W&B under ``ckpt_dir/wandb``.
    Raises :class:`watcher.callbacks.CallbackSpecError` (one line) when it cannot work:
    its package is missing, the tracking server does not answer, ...
    """
    if name == "tensorboard":
        from watcher.tensorboard import TensorBoardExport

        return TensorBoardExport(tensorboard_dir or ckpt_dir / "tensorboard")
    if name == "mlflow":
        from watcher.mlflow_export import MlflowExport

        return MlflowExport(mlflow_uri, log_artifacts=mlflow_log_artifacts)
    if name == "wandb":
        from watcher.wandb_export import WandbExport

        return WandbExport(ckpt_dir)
    raise CallbackSpecError(f"unknown tracker {name!r}; known: {', '.join(TRACKERS)}")


def exporters_for(
    ckpt_dir: Path,
    tensorboard_dir: Path | None,
    mlflow_uri: str | None,
    mlflow_log_artifacts: bool,
    wandb: bool,
) -> list[Any]:
    """The exporters ``ilab-watch``'s options ask for (CallbackSpecError: one unusable)."""
    if mlflow_log_artifacts and mlflow_uri is None:
        raise CallbackSpecError("--mlflow-log-artifacts needs --mlflow")
    wanted = {"tensorboard": tensorboard_dir is not None, "mlflow": mlflow_uri is not None}
    wanted["wandb"] = wandb
    return [
        make_exporter(
            name,
            ckpt_dir,
            tensorboard_dir=tensorboard_dir,
            mlflow_uri=mlflow_uri or None,
            mlflow_log_artifacts=mlflow_log_artifacts,
        )
        for name, on in wanted.items()
        if on
    ]
