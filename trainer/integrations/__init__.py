"""Bridges that give trainers people already use the journal and its control channel:
:mod:`trainer.integrations.hf_trainer` (HF ``Trainer``, TRL) and
:mod:`trainer.integrations.accelerate_tracker` (a hand-written Accelerate loop). Both write
through :class:`trainer.run_journal.RunJournal`, as ``ilab-train`` does."""
