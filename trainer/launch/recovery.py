"""A launch that goes wrong: the launcher's hang guard (``hang_after``, ``hang_action``), the
``train_end`` of an attempt it aborted, and relaunching failed attempts
(``max_restarts``). docs/alerts.md, "Abort and restart".

The guard and its rules are the watcher's (:mod:`watcher.alerts`), run here on a thread of
the launching process, which knows its torchrun agent and outlives its workers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from journal.read.cursor import Cursor
from trainer.config import ConfigError, TrainingArgs
from trainer.launch.result import TrainingFailed, TrainingResult


def launch_with_restarts(
    launch: Callable[[TrainingArgs, int], TrainingResult], train_args: TrainingArgs
) -> TrainingResult:
    """``launch(train_args, restarts)``, again after a failed (or hang-aborted) attempt
    while ``max_restarts`` allows. Each relaunch continues the run (its run id, the next
    attempt; ``restarts`` tells the workers so) from its newest complete checkpoint by the
    workers' own resume rule (``resume="auto"``: the step is the checkpoint's), under the run
    lock the caller holds throughout."""
    restarts = 0
    while True:
        try:
            result = launch(train_args, restarts)
        except TrainingFailed as exc:
            exc.result.restarts = restarts
            if restarts >= train_args.max_restarts:
                raise
            restarts += 1
            print(
                f"ilab-train: attempt {exc.result.attempt or '?'} ended "
                f"{exc.result.status}: {exc.result.reason or 'unknown error'}; relaunching "
                f"from the newest checkpoint (restart {restarts} of {train_args.max_restarts})",
                file=sys.stderr,
            )
            train_args = train_args.model_copy(update={"resume": "auto"})
            continue
        result.restarts = restarts
        return result


def resolve_notify(train_args: TrainingArgs) -> TrainingArgs:
    """``notify`` as the URLs to tell, each judged by apprise: a ``@FILE``'s read, and with
    none given, ``ILAB_NOTIFY``'s (docs/alerts.md). A bad one is a :class:`ConfigError` (one
    line) before anything is created or launched."""
    from watcher.alerts.notify import BadTarget, notify_urls, parse_targets

    try:
        urls = notify_urls(url.get_secret_value() for url in train_args.notify)
        parse_targets(urls)
    except BadTarget as exc:
        raise ConfigError(exc.format_message()) from None
    return train_args.model_copy(update={"notify": [SecretStr(url) for _, url in urls]})


def open_launch_alerts(train_args: TrainingArgs, ckpt_dir: Path) -> Any:
    """``notify``'s alerts for this launch (``watcher.alerts.options.Alerting``: the sink
    and the journal's rules, one more callback of the embedded watcher), or None when no
    ``notify*`` setting is given. Raises :class:`ConfigError` (one line) for a target or an
    expression that can never work, before any worker starts."""
    if not (train_args.notify or train_args.notify_when or train_args.notify_on is not None):
        return None
    import click

    from watcher.alerts.options import open_alerts

    try:
        return open_alerts(
            ckpt_dir,
            str(ckpt_dir),
            notify=[url.get_secret_value() for url in train_args.notify],
            notify_when=train_args.notify_when,
            notify_on=train_args.notify_on,
            source="run_training",
        )
    except click.UsageError as exc:
        raise ConfigError(exc.format_message()) from None


def start_guard(
    train_args: TrainingArgs, ckpt_dir: Path, start_offset: int, sink: Any = None, restarts: int = 0
) -> Any:
    """The launcher's hang guard over this launch's records (from ``start_offset``),
    started; None without ``hang_after`` (or without a journal to read). Its alerts go to
    ``sink`` (``notify``'s, which the caller closes), else to a sink of its own that only
    journals them; a hang alert says whether a relaunch follows (``restarts``: those
    made before this launch)."""
    if train_args.hang_after is None or train_args.journal_detail == "off":
        return None
    from watcher.alerts.guard import Guard, GuardOptions
    from watcher.alerts.hang import HangRule
    from watcher.alerts.sink import AlertDispatcher

    if sink is None:
        sink = AlertDispatcher(ckpt_dir, run_label=str(ckpt_dir), source="run_training")
    most = train_args.max_restarts
    relaunch = f"no relaunch follows (--max-restarts {most}{' used up' if most else ''})"
    if restarts < most:
        relaunch = (
            f"a relaunch from the newest checkpoint follows (restart {restarts + 1} of {most})"
        )
    options = GuardOptions(
        HangRule.parse(train_args.hang_after), train_args.hang_action, relaunch=relaunch
    )
    guard = Guard(
        ckpt_dir,
        sink,
        options,
        start=Cursor(start_offset),
        launcher_pids={"launcher": os.getpid()},  # its torchrun agent joins once started
        source="run_training",
    )
    guard.start()
    return guard


def abort_marker(ckpt_dir: Path, begin: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The abort marker a hang guard (this launcher's or an ``ilab-watch``'s) left for the
    attempt ``begin`` started, or None."""
    if begin is None or not (ckpt_dir / "alerts").is_dir():
        return None
    from watcher.alerts.guard import find_abort

    return find_abort(ckpt_dir, begin["run_id"], begin["attempt"])


def hang_end(marker: dict[str, Any], rc: int) -> dict[str, Any]:
    """The fallback ``train_end`` of workers a hang guard aborted (said on the console)."""
    from watcher.alerts.guard import hang_end_payload

    payload = hang_end_payload(marker, written_by="launcher", rc=rc)
    print(f"ilab-train: {payload['reason']}", file=sys.stderr)
    return payload
