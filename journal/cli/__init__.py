"""``ilab-journal``: one module per command group, with the renderer (``format.py``)."""

from journal.cli.main import main

__all__ = ["main"]
