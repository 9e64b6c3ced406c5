"""What a run asks for: the settings, their checks, ``--config`` files and the CLI options
made from them. No torch here: the launcher, ``ilab-train --help`` and the bridges load it.

The public names live in :mod:`trainer.config.args` (and ``TorchrunArgs`` in
:mod:`trainer.config.torchrun`) and are re-exported here, so
``from trainer.config import TrainingArgs`` is the import to use."""

from trainer.config.args import ConfigError, TrainingArgs
from trainer.config.model import ModelConfig
from trainer.config.torchrun import TorchrunArgs
from trainer.config.worker_config import WorkerConfig

__all__ = ["ConfigError", "ModelConfig", "TorchrunArgs", "TrainingArgs", "WorkerConfig"]
