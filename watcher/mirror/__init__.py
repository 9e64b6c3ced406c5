"""``ilab-watch DIR --mirror URI``: a run's checkpoints and journal copied to object storage
as they are written (docs/mirror.md). :mod:`.mirror` runs it; :mod:`.checkpoints` uploads a
checkpoint and its marker; :mod:`.segments` cuts the journal into segments; :mod:`.inbound`
brings remote watchers' reports and commands in; :mod:`.options` is its command line."""
