"""lm-evaluation-harness on every save's Hugging Face export (``ilab-watch --lm-eval``):
the command each save runs (:mod:`watcher.lmeval.job`), its results as report metrics
(:mod:`watcher.lmeval.metrics`) and the options and start-up checks
(:mod:`watcher.lmeval.options`)."""
