"""The experiment trackers by name: the one place that knows which exporter each
``--report-to`` / ``ilab-watch --mlflow/--wandb/--tensorboard`` name stands for. The
exporters import :mod:`watcher.exporters.base` (their base); this module imports them, lazily, so
a tracker's package is loaded only when it is asked for."""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from watcher.exporters.base import MetricsExport
from watcher.hooks.callbacks import CallbackSpecError

#: ``--report-to`` / ``TrainingArgs.report_to`` names
TRACKERS = ("tensorboard", "mlflow", "wandb")


def make_exporter(
    name: str,
    ckpt_dir: Path,
    *,
    tensorboard_dir: Path | None = None,
    mlflow_uri: str | None = None,
    mlflow_log_artifacts: bool = False,
    settings: Mapping[str, str] | None = None,
) -> MetricsExport:
    """The exporter called ``name`` (one of :data:`TRACKERS`) for the run in ``ckpt_dir``.

    TensorBoard writes to ``tensorboard_dir`` (default ``ckpt_dir/tensorboard``), one
    subdirectory per journal run; MLflow
    to ``mlflow_uri`` (default ``$MLFLOW_TRACKING_URI``); W&B under ``ckpt_dir/wandb``.
    ``settings`` (``TrainingArgs.tracker_settings``: ``tensorboard_dir``,
    ``mlflow_tracking_uri``, ``mlflow_experiment``, ``mlflow_run_name``, ``wandb_project``,
    ``wandb_entity``, ``wandb_run_name``) fill what the arguments leave out.
    Raises :class:`watcher.hooks.callbacks.CallbackSpecError` (one line) when it cannot work:
    its package is missing, the tracking server does not answer, ...
    """
    s = settings or {}
    if name == "tensorboard":
        from watcher.exporters.tensorboard_export import TensorBoardExport

        tb = tensorboard_dir or (Path(s["tensorboard_dir"]) if s.get("tensorboard_dir") else None)
        return TensorBoardExport(tb or ckpt_dir / "tensorboard")
    if name == "mlflow":
        from watcher.exporters.mlflow_export import MlflowExport

        return MlflowExport(
            mlflow_uri or s.get("mlflow_tracking_uri"),
            log_artifacts=mlflow_log_artifacts,
            experiment=s.get("mlflow_experiment"),
            run_name=s.get("mlflow_run_name"),
        )
    if name == "wandb":
        from watcher.exporters.wandb_export import WandbExport

        return WandbExport(
            ckpt_dir,
            project=s.get("wandb_project"),
            entity=s.get("wandb_entity"),
            run_name=s.get("wandb_run_name"),
        )
    raise CallbackSpecError(f"unknown tracker {name!r}; known: {', '.join(TRACKERS)}")


def exporters_for(
    ckpt_dir: Path,
    tensorboard_dir: Path | None,
    mlflow_uri: str | None,
    mlflow_log_artifacts: bool,
    wandb: bool,
) -> Iterator[Any]:
    """The exporters ``ilab-watch``'s options ask for (CallbackSpecError: one unusable),
    made when iterated: once every other hook is made."""
    if mlflow_log_artifacts and mlflow_uri is None:
        raise CallbackSpecError("--mlflow-log-artifacts needs --mlflow")
    wanted = {"tensorboard": tensorboard_dir is not None, "mlflow": mlflow_uri is not None}
    wanted["wandb"] = wandb
    for name, on in wanted.items():
        if on:
            yield make_exporter(
                name,
                ckpt_dir,
                tensorboard_dir=tensorboard_dir,
                mlflow_uri=mlflow_uri or None,
                mlflow_log_artifacts=mlflow_log_artifacts,
            )


def replay_command(name: str, ckpt_dir: Path, settings: Mapping[str, str] | None = None) -> str:
    """The ``ilab-watch`` line that writes (or completes) the tracker ``name``'s copy of the
    run from its journal: exporters skip the points the tracker already holds."""
    s, q = settings or {}, shlex.quote
    env = ""
    if name == "tensorboard":
        where = s.get("tensorboard_dir") or str(ckpt_dir / "tensorboard")
        opt = f"--tensorboard {q(where)}"
    elif name == "mlflow":
        uri = s.get("mlflow_tracking_uri")
        opt = f"--mlflow {q(uri)}" if uri else "--mlflow"
        if s.get("mlflow_experiment"):
            env = f"MLFLOW_EXPERIMENT_NAME={q(s['mlflow_experiment'])} "
    else:
        opt = "--wandb"
        for key, var in (("wandb_project", "WANDB_PROJECT"), ("wandb_entity", "WANDB_ENTITY")):
            if s.get(key):
                env += f"{var}={q(s[key])} "
    return f"{env}ilab-watch {q(str(ckpt_dir))} {opt} --replay"
