"""lm-evaluation-harness on every save's Hugging Face export (``ilab-watch --lm-eval``):
the command each save runs (:mod:`watcher.lmeval.job`), its results as report metrics
(:mod:`watcher.lmeval.metrics`) and the options and start-up checks
(:mod:`watcher.lmeval.options`).

``lm_eval_hook(...)`` gives the same ``save`` command for ``run_training``'s ``on_save``.
"""

from watcher.lmeval.options import lm_eval_hook

__all__ = ["lm_eval_hook"]
