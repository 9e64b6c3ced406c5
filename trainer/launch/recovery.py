"""A launch that goes wrong: the launcher's hang guard (``hang_after``, ``hang_action``), the
``train_end`` of an attempt it aborted, and relaunching failed attempts
(``max_restarts``) until they make no progress; which rank ended first, and how, when the
workers wrote no ``train_end``. docs/alerts.md, "Abort and restart".

The guard and its rules are the watcher's (:mod:`watcher.alerts`), run here on a thread of
the launching process, which knows its torchrun agent and outlives its workers.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from journal.rundir.inbox import read_json_object
from journal.rundir.paths import rank_log_path
from journal.rundir.safety import open_no_follow
from journal.store import Cursor
from trainer.config import ConfigError, TrainingArgs
from trainer.config.worker_config import relaunch
from trainer.launch.console import say
from trainer.launch.result import NoProgress, TrainingFailed, TrainingResult

#: What a failure's alert quotes of the log of the rank that ended first, at most.
LOG_TAIL_CHARS = 2000


def launch_with_restarts(
    launch: Callable[[TrainingArgs, int, int], TrainingResult], train_args: TrainingArgs
) -> TrainingResult:
    """``launch(train_args, restarts, stalled)``, again after a failed (or hang-aborted)
    attempt while the relaunch rule (:func:`trainer.config.worker_config.relaunch`)
    allows. Each relaunch continues the run (its run id, the next attempt; ``restarts``
    tells the workers so) from its newest complete checkpoint by the workers' own resume
    rule (``resume="auto"``: the step is the checkpoint's), under the run lock the caller
    holds throughout. Failed attempts that saved nothing, ``max_no_progress_attempts`` in a
    row, end it: :class:`NoProgress`, with each attempt's cause."""
    restarts = stalled = 0
    causes: list[str] = []
    while True:
        try:
            result = launch(train_args, restarts, stalled)
            result.restarts = restarts
            return result
        except TrainingFailed as exc:
            got = exc.result
            got.restarts = restarts
            attempt, reason = got.attempt or "?", got.reason or "unknown error"
            causes.append(f"attempt {attempt}: {reason}")
            after = relaunch(train_args, restarts, stalled, got.last_checkpoint is not None)
            if not after.left and restarts < train_args.max_restarts:  # no progress
                why = f"{after.says}: {'; '.join(causes)} (log: {got.log_path})"
                raise NoProgress(f"training failed; {why}", got) from None
            if not after.left:
                raise
            restarts, stalled = restarts + 1, after.stalled
            say(f"attempt {attempt} ended {got.status}: {reason}; {after.says}")
            train_args = train_args.model_copy(update={"resume": "auto"})


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
    train_args: TrainingArgs,
    ckpt_dir: Path,
    start_offset: int,
    sink: Any = None,
    restarts: int = 0,
    stalled: int = 0,
) -> Any:
    """The launcher's hang guard over this launch's records (from ``start_offset``),
    started; None without ``hang_after`` (or without a journal to read). Its alerts go to
    ``sink`` (``notify``'s, which the caller closes), else to a sink of its own that only
    journals them; a hang alert says what follows by the relaunch rule (``restarts`` and
    ``stalled``: this launch's, as :func:`launch_with_restarts` counts them)."""
    if train_args.hang_after is None or train_args.journal_detail == "off":
        return None
    from watcher.alerts.guard import GuardOptions
    from watcher.alerts.guard_options import start_guard as start
    from watcher.alerts.hang import HangRule
    from watcher.alerts.sink import AlertDispatcher

    if sink is None:
        sink = AlertDispatcher(ckpt_dir, run_label=str(ckpt_dir), source="run_training")
    options = GuardOptions(
        HangRule(None if train_args.hang_after == "auto" else float(train_args.hang_after)),
        train_args.hang_action,
        relaunch=lambda saved: relaunch(train_args, restarts, stalled, saved).says,
    )
    return start(
        ckpt_dir,
        sink,
        options,
        start=Cursor(start_offset),
        launcher_pids={"launcher": os.getpid()},  # its torchrun agent joins once started
        source="run_training",
    )


def abort_marker(ckpt_dir: Path, begin: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The abort marker a hang guard (this launcher's or an ``ilab-watch``'s) left for the
    attempt ``begin`` started, or None."""
    if begin is None or not (ckpt_dir / "alerts").is_dir():
        return None
    from watcher.alerts.guard import find_abort

    return find_abort(ckpt_dir, begin["run_id"], begin["attempt"])


def first_failure(ckpt_dir: Path, found: Path, targets: Sequence[Any]) -> dict[str, Any]:
    """The ``train_end`` fields of workers that ended without one, when torchrun's agent
    wrote which rank it saw end first (``found``, trainer/launch/agent.py): that rank, how
    it ended (a signal or an exit code) and its log, whose last lines follow the first
    line of ``error_message`` (indented, scrubbed of ``targets``' secrets as alerts are,
    at most :data:`LOG_TAIL_CHARS`); {} without."""
    try:
        first = read_json_object(found)  # never through a link, never blocking on a FIFO
        rank, pid, code = first["rank"], first["pid"], int(first["exitcode"])
        log = rank_log_path(ckpt_dir, int(rank))
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    how = f"was killed by {first.get('signal')}" if code < 0 else f"exited with code {code}"
    reason = f"rank {rank} (pid {pid}) {how}, the first rank to end; its log: {log}"
    tail = _last_lines(ckpt_dir, log, targets)
    first["log"] = str(log.relative_to(ckpt_dir))
    return {"reason": reason, "error_message": f"{reason}\n{tail}".rstrip(), "first_failure": first}


def _last_lines(
    ckpt_dir: Path, log: Path, targets: Sequence[Any], limit: int = LOG_TAIL_CHARS
) -> str:
    """The last lines of ``log`` in at most ``limit`` characters, each indented, without
    any secret of ``targets``' URLs ('' when it cannot be read; never through a link, never
    a FIFO's wait)."""
    from watcher.alerts.notify import scrub
    from watcher.hooks.command import read_tail

    try:
        with open(open_no_follow(log, os.O_RDONLY, root=ckpt_dir), "rb") as f:
            text = scrub(read_tail(f, 4 * limit).data.decode(errors="replace"), targets)
    except OSError:
        return ""
    lines, size = [], 0
    for line in reversed(text.splitlines()):
        size += len(line) + 3  # its indent and newline
        if size > limit:
            break
        lines.append(f"  {line}")
    return "\n".join(reversed(lines))


def hang_end(marker: dict[str, Any], rc: int) -> dict[str, Any]:
    """The fallback ``train_end`` of workers a hang guard aborted (said on the console)."""
    from watcher.alerts.guard import hang_end_payload

    payload = hang_end_payload(marker, written_by="launcher", rc=rc)
    say(payload["reason"])
    return payload
