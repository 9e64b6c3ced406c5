"""Saves: sharded DCP checkpoints and their consolidated model (:mod:`~trainer.checkpoint.sharded`),
the asynchronous save (:mod:`~trainer.checkpoint.async_save`), checkpoint files read without
unpickling code, resumes into another model shape, and ``python -m trainer.checkpoint.export``."""
