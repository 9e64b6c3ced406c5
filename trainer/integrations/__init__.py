"""Bridges that give trainers people already use the journal and its control channel:
:mod:`trainer.integrations.hf_trainer` (HF ``Trainer``, TRL),
:mod:`trainer.integrations.lightning` (``lightning.pytorch.Trainer``) and
:mod:`trainer.integrations.accelerate_tracker` (a hand-written Accelerate loop). All write
through :class:`trainer.journaling.run_journal.RunJournal`, as ``ilab-train`` does."""
