"""Inside torchrun, one process per rank: the worker entry (:mod:`trainer.rank.worker`),
start-up (process group, agreement, the built model and data), the training loop and its
step boundary (one all-reduce carries the metrics and the control bits). Never imports the
watcher, nor the launcher."""
