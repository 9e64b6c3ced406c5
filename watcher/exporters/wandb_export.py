"""``ilab-watch DIR --wandb``: the journal as Weights & Biases runs.

One W&B run per journal ``run_id`` (the W&B run id is the journal's), so a resume, a
restarted watcher and a replay all continue the same run. Offline unless ``WANDB_MODE``
says ``online``: wandb writes ``<WANDB_DIR or DIR>/wandb/offline-run-<time>-<run_id>/``,
which ``wandb sync`` uploads. The config is ``train_begin``'s; metrics are the exporters'
shared ``train/*``, ``eval/*`` and ``report/*`` (watcher/exporters/base.py), each with its own x
axis (``train/step``, ``eval/step``, ``report/step``: a report for an earlier checkpoint
arrives after later steps, which W&B's single step counter would drop), and the record's
time as ``_timestamp``. ``save`` sets ``checkpoint/<name>`` in the summary (a removal
``checkpoint/<name>/removed``, its reason) and, as the run's fold says,
``ilab/last_checkpoint`` (the newest not removed);
``train_end`` sets ``ilab/status`` and ``ilab/stop_source``, and the run is finished when the watcher is done (:meth:`close`) with
that ending's exit code (0 completed or stopped, 1 failed, 5 interrupted, as
``ilab-train``'s).

No duplicates: each watcher start makes a new run directory for the same id, so the
exporter first reads the history of every earlier one of the same project
(watcher/exporters/wandb_log.py) and skips a row it holds (same prefix, step and time).
The directory, entity and project are part of the watcher's cursor identity: another
project gets the journal from its start. A directory wandb could not write is refused at
start (wandb would write to /tmp instead, where no later replay finds the rows). Needs the
``wandb`` package
(``ilab-journal[wandb]``).
"""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

from journal.views.fold import RunFold
from watcher.exporters.base import MetricsExport, RunFolds, stop_said
from watcher.exporters.wandb_log import history_rows, project, run_files
from watcher.hooks.callbacks import CallbackSpecError, Event

DEFAULT_PROJECT = "ilab-journal"
_EXIT_CODES = {"completed": 0, "stopped": 0, "failed": 1, "interrupted": 5}


class WandbExport(MetricsExport):
    """Writes the journal's runs to W&B run directories (offline by default).

    Args:
        ckpt_dir: the run's directory; run directories go under ``ckpt_dir/wandb`` unless
            ``WANDB_DIR`` is set.
        project: W&B project (default: ``WANDB_PROJECT``, else ``ilab-journal``).
        entity: W&B team or user (default: ``WANDB_ENTITY``, else wandb's default).
        run_name: the W&B run's name (default: ``<ckpt dir name>-<journal run id>``).

    Raises:
        CallbackSpecError: wandb is not installed, ``WANDB_MODE`` is neither offline nor
            online, or the directory cannot be written.
    """

    def __init__(
        self,
        ckpt_dir: str | Path,
        *,
        project: str | None = None,
        entity: str | None = None,
        run_name: str | None = None,
    ) -> None:
        self.entity, self.run_name = entity, run_name
        try:
            import wandb  # noqa: F401
        except ImportError:
            raise CallbackSpecError(
                "--wandb needs the wandb package: pip install 'ilab-journal[wandb]'"
            ) from None
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        if self.mode not in ("offline", "online"):
            raise CallbackSpecError(f"--wandb: WANDB_MODE={self.mode!r}; use offline or online")
        self.root = Path(os.environ.get("WANDB_DIR") or ckpt_dir)
        self.project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        _check_writable(self.root)
        # where the rows go is the watcher's cursor identity (MetricsExport.callback_label)
        self.destination = f"wandb {self.root.resolve()} {self.entity or ''}/{self.project}"
        self._lock = threading.Lock()  # hooks of different events run in different threads
        self._run: Any = None
        self._exit_code = 0
        self._run_id: str | None = None
        self._seen: set[tuple[str, int, float]] = set()  # (prefix, step, time)
        self._folds = RunFolds()  # each run dir's fold: its checkpoints and who ended it

    # -- hooks (log, evaluate and report: MetricsExport) ----------------------------------

    def on_train_begin(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)  # a new attempt: the fold's ending is its own
            self._open(event).config.update(data.get("config") or {}, allow_val_change=True)

    def on_save(self, event: Event, **data: Any) -> None:
        path = data.get("checkpoint_path")
        if isinstance(path, str):
            with self._lock:
                run = self._open(event)
                run.summary[f"checkpoint/{Path(path).name}"] = path
                self._newest(run, self._folds.add(event))

    def on_checkpoint_removed(self, event: Event, **data: Any) -> None:
        path = data.get("checkpoint_path")
        with self._lock:
            run = self._open(event)
            if isinstance(path, str):  # the save's fate, beside it
                run.summary[f"checkpoint/{Path(path).name}/removed"] = (
                    data.get("reason") or "removed"
                )
            self._newest(run, self._folds.add(event))

    def on_control(self, event: Event, **data: Any) -> None:
        with self._lock:
            self._folds.add(event)  # an applied stop: who ended the run

    def on_train_end(self, event: Event, **data: Any) -> None:
        status = str(data.get("status"))
        with self._lock:
            run = self._open(event)
            run.summary["ilab/status"] = status
            if data.get("reason"):
                run.summary["ilab/reason"] = str(data["reason"])
            source, by = stop_said(self._folds.add(event).summary())
            run.summary["ilab/stop_source"], run.summary["ilab/stopped_by"] = source, by
            # finished by close(): hooks of other events may still deliver earlier records
            self._exit_code = _EXIT_CODES.get(status, 1)

    def close(self) -> None:
        """Finish the open W&B run (the watcher is done), with the last ending's exit code."""
        with self._lock:
            self._finish()

    def _finish(self) -> None:
        if self._run is not None:
            self._run.finish(exit_code=self._exit_code)
        self._run, self._exit_code = None, 0

    @staticmethod
    def _newest(run: Any, fold: RunFold) -> None:
        """``ilab/last_checkpoint``: the fold's (the newest not removed; None: none left)."""
        run.summary["ilab/last_checkpoint"] = fold.last_checkpoint

    # -- writing -------------------------------------------------------------------------

    def write_scalars(self, prefix: str, values: dict[str, float], step: int, event: Event) -> None:
        with self._lock:
            run = self._open(event)
            if (prefix, step, event.ts) in self._seen:
                return
            run.log({**values, f"{prefix}/step": step, "_timestamp": event.ts})
            self._seen.add((prefix, step, event.ts))

    def _open(self, event: Event) -> Any:
        """The W&B run of the event's journal run (a new one finishes the previous)."""
        import wandb

        if self._run is not None and self._run_id == event.run_id:
            return self._run
        self._finish()  # the previous journal run's
        self._seen = _logged(self.root, event.run_id, self.project)
        self._run_id = event.run_id
        self._run = wandb.init(
            id=event.run_id,
            project=self.project,
            entity=self.entity,
            name=self.run_name or f"{Path(event.ckpt_dir).name}-{event.run_id}",
            dir=str(self.root),
            mode="online" if self.mode == "online" else "offline",
            resume="allow",
            settings=wandb.Settings(
                console="off",
                silent=True,
                x_disable_stats=True,
                save_code=False,
                disable_git=True,
                x_save_requirements=False,
            ),
        )
        for prefix in ("train", "eval", "report"):
            self._run.define_metric(f"{prefix}/step")
            self._run.define_metric(f"{prefix}/*", step_metric=f"{prefix}/step")
        return self._run


def _check_writable(root: Path) -> None:
    """Raise :class:`CallbackSpecError` (one line) unless wandb can write under ``root``.

    wandb itself falls back to the system's temp dir for a dir it cannot write (a warning
    on the console, nothing else): the run's rows then land where no replay looks for them
    (:func:`_logged` reads ``root``), so each replay would write them all again. So a real
    write is tried, in the ``wandb`` dir it writes to (which may exist on a file system
    that became read-only), and ``root`` must pass wandb's own check (``os.access``)."""
    where = root / "wandb"
    try:
        where.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=where, prefix=".ilab-write-check-")
        os.close(fd)
        os.unlink(probe)
        if not os.access(root, os.W_OK | os.R_OK):
            raise PermissionError(errno.EACCES, "not readable and writable", str(root))
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise CallbackSpecError(
            f"--wandb: cannot write {where}: {why} (set WANDB_DIR to a writable directory)"
        ) from None


def _logged(root: Path, run_id: str, project_name: str) -> set[tuple[str, int, float]]:
    """(prefix, step, time) of every row earlier run directories of ``run_id`` hold for
    ``project_name`` (another project's rows are not this one's: a new project gets them all)."""
    seen = set()
    for f in run_files(root, run_id):
        if project(f) not in (None, project_name):
            continue
        for row in history_rows(f):
            for key, value in row.items():
                if key.endswith("/step") and isinstance(value, int):
                    seen.add((key[: -len("/step")], value, row.get("_timestamp")))
    return seen  # type: ignore[return-value]
