"""Rank 0's journal client, shared by the native loop (:mod:`trainer.rank`) and the bridges
(:mod:`trainer.integrations`): :class:`trainer.journaling.run_journal.RunJournal` (lock,
resume rule, control, reports, best checkpoint, ``train_end``) and the record
:mod:`~trainer.journaling.emitter`."""
