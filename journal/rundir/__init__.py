"""A run dir: where things live in it (``paths``), who may own and steer it (``safety``), its
locks, inboxes, durable small files and the processes we start."""

# documented as journal.rundir.UnsafeRunDir (docs/journal-format.md) before this folder
from journal.rundir.safety import UnsafeRunDir

__all__ = ["UnsafeRunDir"]
