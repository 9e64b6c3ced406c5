"""``ilab-watch``: its options and main."""

from watcher.cli.main import main

__all__ = ["main"]
