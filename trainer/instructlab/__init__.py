"""InstructLab's training API on this trainer (docs/instructlab.md): its
``run_training(torch_args, train_args)`` and ``--instructlab-config`` files, mapped onto
:class:`trainer.config.TrainingArgs` by the table in :mod:`trainer.instructlab.fields`.

The names live in :mod:`trainer.instructlab.run` and are re-exported here."""

from trainer.instructlab.run import (
    TORCH_FIELDS,
    TORCHRUN_DEFAULT_PORT,
    InstructLabConfigError,
    as_fields,
    from_config,
    load_config,
    map_torch_args,
    map_train_args,
    run_training,
    to_ours,
)

__all__ = [
    "TORCHRUN_DEFAULT_PORT",
    "TORCH_FIELDS",
    "InstructLabConfigError",
    "as_fields",
    "from_config",
    "load_config",
    "map_torch_args",
    "map_train_args",
    "run_training",
    "to_ours",
]
