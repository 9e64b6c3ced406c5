"""Bridges that give trainers people already use the journal and its control channel:
:mod:`trainer.integrations.hf_trainer` (HF ``Trainer``, TRL)."""
