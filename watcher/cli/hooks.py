"""The hooks ``ilab-watch``'s command line asks for: ``--on-<event>`` and ``--on``
commands, ``--callback`` objects and the built-ins, the exporters, and ``--via``'s abort
hook, with their options (put together by :func:`watcher.hooks.hook.assemble_hooks`, as
the embedded watcher's are)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import Any

import click

from journal.record.events import EVENTS
from watcher.builtin.foreign import adapt
from watcher.builtin.steering import parse_builtin
from watcher.hooks.callbacks import CallbackSpecError
from watcher.hooks.hook import HookOptions, HookSet, QueuePolicy, assemble_hooks, instantiate
from watcher.hooks.loading import load_object
from watcher.scheduler.board import JobBoard
from watcher.scheduler.options import abort_hook


def hook_options(
    policies: dict[str | None, QueuePolicy],
    timeout: float | None,
    retries: int,
    backoff: float,
    concurrency: int,
    board: JobBoard | None,
) -> Callable[[str], HookOptions]:
    """Each event's hook options, from the command line (``board``: ``--via``'s)."""

    def options_for(event: str) -> HookOptions:
        return HookOptions(
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            concurrency=concurrency,
            queue=policies.get(event, policies.get(None)),
            via=board.scheduler.name if board is not None else None,
        )

    return options_for


def _checked(pairs: list[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """The ``(event, CMD)`` pairs, each event checked as its hook is made."""
    for event, cmd in pairs:
        if event not in EVENTS:
            raise CallbackSpecError(f"unknown event {event!r}; known: {', '.join(EVENTS)}")
        yield event, cmd


def callback_objects(
    callbacks: tuple[str, ...], early_stopping: str | None, divergence: str | None
) -> Iterator[Any]:
    """The ``--callback`` objects, then the built-ins asked for (made when iterated)."""
    # InstructLab's and training_hub's callbacks run as their trainers would call them
    yield from adapt([instantiate(load_object(spec), spec) for spec in callbacks])
    if early_stopping is not None:
        yield parse_builtin("early-stopping", early_stopping)
    if divergence is not None:
        yield parse_builtin("divergence", divergence)


def build_hooks(
    pairs: list[tuple[str, str]],
    objects: Iterable[Any],
    exporters: Iterable[Any],
    options_for: Callable[[str], HookOptions],
    *,
    shell: bool,
    board: JobBoard | None,
) -> HookSet:
    """Every hook the command line asks for (exporters last, closed at the end); a hook
    that cannot be made is a usage error."""
    try:
        built = assemble_hooks(_checked(pairs), objects, exporters, options_for, shell=shell)
    except CallbackSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if board is not None:
        if not pairs:
            raise click.UsageError(
                f"--via {board.scheduler.name} runs command hooks: give --on-save CMD"
            )
        if board.cancel_on_abort:
            built.hooks.append(abort_hook(board, lambda e: replace(options_for(e), via=None)))
    return built
