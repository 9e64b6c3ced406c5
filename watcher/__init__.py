"""watcher package."""
