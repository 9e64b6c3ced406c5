"""The launching process: it checks the settings and the data, starts torchrun and waits.
It never trains, and imports no torch at module level (the workers are :mod:`trainer.rank`).

``run_training`` and its results and errors live in :mod:`trainer.launch.run` and are
re-exported here: ``from trainer.launch import run_training`` (docs/python-api.md)."""

from trainer.launch.run import RunDirBusy, TrainingFailed, TrainingResult, run_training

__all__ = ["RunDirBusy", "TrainingFailed", "TrainingResult", "run_training"]
