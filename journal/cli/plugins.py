"""Commands of ``ilab-journal`` that other packages provide: the entry points of group
:data:`COMMANDS_GROUP` (pyproject.toml), each a click command named by its entry point
(``backtest`` is the watcher's: it runs the watcher's callbacks, and journal/ never
imports the watcher). Looked up only when a name is none of ours, so the commands
scripts call often (``status``, ``check``) start as fast as before."""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

import click

COMMANDS_GROUP = "ilab_journal.commands"


class PluginGroup(click.Group):
    """A click group that also finds commands through :data:`COMMANDS_GROUP`."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        for ep in entry_points(group=COMMANDS_GROUP, name=cmd_name):
            command: Any = ep.load()
            return command if isinstance(command, click.Command) else None
        return None

    def list_commands(self, ctx: click.Context) -> list[str]:
        ours = super().list_commands(ctx)
        return sorted({*ours, *(ep.name for ep in entry_points(group=COMMANDS_GROUP))})
