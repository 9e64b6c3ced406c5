"""The public import paths keep working wherever the modules behind them live: every name
docs/python-api.md, docs/integrations.md, docs/instructlab.md and README.md tell people to
import (a move re-exports them from the package they name)."""

from __future__ import annotations

import importlib

import pytest

#: module -> names the docs import from it.
PUBLIC = {
    "trainer.config": [
        "TrainingArgs",
        "TorchrunArgs",
        "WorkerConfig",
        "ModelConfig",
        "ConfigError",
    ],
    "trainer.launch": ["run_training", "RunDirBusy", "TrainingFailed", "TrainingResult"],
    "trainer.launch.preflight": ["preflight"],
    "trainer.instructlab": ["run_training", "InstructLabConfigError", "from_config"],
    "trainer.cli": ["main"],  # ilab-train's entry point, pyproject's trainer.cli:main
    "journal": ["Control", "send_command", "Report", "submit_report", "JournalReader"],
    "journal.record.events": ["EVENTS"],
    "journal.channels.control": ["wait_for_verdict", "Control"],
    "journal.views.query": ["find_best"],
    "journal.checkpoints.leases": ["acquire", "release"],
    "journal.read.reader": ["JournalReader"],
    "journal.rundir.safety": ["UnsafeRunDir"],
    "journal.views.best": ["MetricGoal"],
    "watcher": ["EarlyStopping", "TrainerCallback"],
}
#: The bridges, each with the package its trainer comes from (an extra).
BRIDGES = {
    "trainer.integrations.hf_trainer": ("transformers", "JournalCallback"),
    "trainer.integrations.accelerate_tracker": ("accelerate", "JournalTracker"),
    "trainer.integrations.lightning": ("lightning", "JournalCallback"),
    "trainer.instructlab.hub": ("training_hub", "IlabJournalSFTBackend"),
}


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_names_import(module: str) -> None:
    mod = importlib.import_module(module)
    missing = [n for n in PUBLIC[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lacks {missing}"


@pytest.mark.parametrize("module", sorted(BRIDGES))
def test_bridges_import(module: str) -> None:
    extra, name = BRIDGES[module]
    pytest.importorskip(extra)
    assert hasattr(importlib.import_module(module), name)


def test_run_training_is_one_function() -> None:
    """The re-exports are the functions themselves, not copies."""
    from trainer.launch import run, run_training

    assert run_training is run.run_training
