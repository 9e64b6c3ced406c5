"""How ``ilab-journal`` finds its commands without importing them all at start: its own
commands that live in other modules (``check``, ``serve``, ...) are imported when named
(``lazy_commands``), and the commands other packages provide are the entry points of group
:data:`COMMANDS_GROUP` (pyproject.toml), each a click command named by its entry point
(``backtest`` is the watcher's: it runs the watcher's callbacks, and journal/ never
imports the watcher), looked up only when a name is none of ours. So a script's
``ilab-journal status`` pays for status alone."""

from __future__ import annotations

import importlib
from typing import Any

import click

COMMANDS_GROUP = "ilab_journal.commands"


class PluginGroup(click.Group):
    """A click group whose commands may load when named: ``lazy_commands`` maps a name to
    ``module:attribute``; other packages' commands come through :data:`COMMANDS_GROUP`."""

    def __init__(self, *args: Any, lazy_commands: dict[str, str] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.lazy_commands = dict(lazy_commands or {})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is not None:
            return found
        if cmd_name in self.lazy_commands:
            module, _, attr = self.lazy_commands[cmd_name].partition(":")
            ours: click.Command = getattr(importlib.import_module(module), attr)
            self.add_command(ours, cmd_name)  # once
            return ours
        from importlib.metadata import entry_points  # 10 ms: only for a name none of ours

        for ep in entry_points(group=COMMANDS_GROUP, name=cmd_name):
            command: Any = ep.load()
            return command if isinstance(command, click.Command) else None
        return None

    def list_commands(self, ctx: click.Context) -> list[str]:
        from importlib.metadata import entry_points

        ours = {*super().list_commands(ctx), *self.lazy_commands}
        return sorted({*ours, *(ep.name for ep in entry_points(group=COMMANDS_GROUP))})
