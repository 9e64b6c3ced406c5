"""Rank 0's journal client, shared by the native loop (:mod:`trainer.rank`) and the bridges
(:mod:`trainer.integrations`): the run session
:class:`trainer.journaling.run_journal.RunJournal` (lock, resume rule, records, signals, best
checkpoint, ``train_end``), its steering inbox
:class:`trainer.journaling.inbox.SteeringInbox` (control commands and reports, read at step
boundaries and agreed on) and the record :mod:`~trainer.journaling.emitter`."""
