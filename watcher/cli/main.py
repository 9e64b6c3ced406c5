"""``ilab-watch``: run callbacks on journal events, beside (not inside) training."""

from __future__ import annotations

import gc
import hashlib
import logging
import signal
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import click

from journal.record.events import EVENTS
from journal.record.text import PrintableFormatter
from journal.rundir.paths import resolve_journal, watch_dir
from journal.rundir.safety import UnsafeRunDir, check_run_dir, not_a_directory
from watcher.builtin.foreign import adapt
from watcher.builtin.steering import parse_builtin
from watcher.cli.options import parse_queue, watch_options
from watcher.engine.cursor import CursorBusy
from watcher.engine.engine import Watcher
from watcher.engine.fsinfo import needs_polling
from watcher.exporters.base import already_said, close_all, every_record
from watcher.exporters.registry import exporters_for
from watcher.hooks.callbacks import CallbackSpecError, load_object
from watcher.hooks.hook import Hook, HookOptions, hook_for, hooks_for_object, instantiate
from watcher.mirror.options import mirror_options, open_mirror, run_alone
from watcher.mirror.remote import follow_remote
from watcher.scheduler.options import abort_hook, job_board, skipped_words
from watcher.scheduler.runner import JobRunner


def default_name(hooks: list[Hook]) -> str:
    """A cursor name from the hooks (context hooks left out: adding one to a built-in
    must not make an upgraded watcher start over under a new name)."""
    hooks = [h for h in hooks if not h.context] or hooks
    digest = hashlib.sha1("\n".join(sorted(h.id for h in hooks)).encode()).hexdigest()[:8]
    first = hooks[0]
    stem = "".join(c if c.isalnum() else "-" for c in Path(first.label.split()[0]).name)[:24].strip(
        "-"
    )
    return f"{first.event}-{stem}-{digest}"


def _unless_said(reporter: Any) -> Any:
    """The console's line per delivery, except failures whose cause the watcher has said
    once already (a tracker that stopped answering: one line, not one per record)."""
    return lambda out: None if already_said(out.error) else reporter(out)


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@watch_options
@mirror_options
def main(
    dir: Path | str,
    on_pairs: tuple[tuple[str, str], ...],
    callbacks: tuple[str, ...],
    early_stopping: str | None,
    divergence: str | None,
    tensorboard_dir: Path | None,
    mlflow_uri: str | None,
    mlflow_log_artifacts: bool,
    wandb: bool,
    name: str | None,
    state_dir: Path | None,
    start: str,
    replay: bool,
    timeout: float | None,
    retries: int,
    backoff: float,
    concurrency: int,
    queue: tuple[str, ...],
    shell: bool,
    poll: float | None,
    lease_ttl: float,
    quiet: bool,
    verbose: int,
    via: str | None,
    sbatch_args: str | None,
    cancel_on_abort: bool,
    job_poll: float,
    mirror_uri: str | None,
    linger: float,
    download_dir: Path | None,
    **on_event: tuple[str, ...],
) -> None:
    """Follow DIR/journal.jsonl and run callbacks on lifecycle events.

    \b
    CMD is a .py script (run with this Python), an executable, or a command line split
    like a shell would but run without one. {name} placeholders take an envelope or payload
    field and stay one argument each: --on-save 'python eval.py --ckpt {checkpoint_path}'.
    Each run also gets the record as JSON in $ILAB_EVENT_FILE and on stdin (and in
    $ILAB_EVENT_JSON up to 64 KiB) and ILAB_* environment variables (ILAB_EVENT,
    ILAB_STEP, ILAB_CKPT_DIR, ILAB_CHECKPOINT_PATH, ILAB_DELIVERY_ID, ...).
    Every event has --on-<event> (e.g. --on-step-end); --on EVENT CMD works for all.

    \b
    Results flow back: a command may write a JSON object of metrics to $ILAB_REPORT (or run
    `ilab-journal report "$ILAB_CKPT_DIR" name=value ...`); they become report records for
    the delivered checkpoint. A save's checkpoint is leased while its delivery is queued or
    running, so rotation keeps it; a save whose checkpoint was already removed is skipped.

    \b
    Delivery is at-least-once per (event, hook) and survives restarts: a cursor in
    --state-dir remembers what completed. Exit codes: 0 all deliveries succeeded or were
    skipped (after train_end, or the end of --replay), 1 some delivery finally failed,
    2 usage error, 3 another watcher runs this cursor (same --state-dir and --name; the
    message names it), 130 interrupted.
    """
    # A replay makes its records, deliveries and events by the hundred thousand, all
    # short-lived and acyclic: collecting after every 700 allocations took a third of its
    # time (benchmarks/bench_replay.py). This process is ours to tune.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    handler = logging.StreamHandler()
    handler.setFormatter(PrintableFormatter("ilab-watch: %(message)s"))  # text from records
    logging.basicConfig(level=level, handlers=[handler])
    logging.getLogger("watchdog").setLevel(logging.ERROR)  # its shutdown chatter is not news
    remote = follow_remote(dir, download_dir, poll)  # a URI: followed through a replica
    dir = remote.dir if remote is not None else Path(dir)
    journal = resolve_journal(dir, must_exist=False)  # followed, it may not exist yet
    ckpt_dir = journal.parent
    if replay and not journal.is_file():
        raise click.UsageError(f"--replay needs an existing journal; {journal} not found")
    for directory in (ckpt_dir, state_dir, tensorboard_dir):  # below a file: could never start
        if directory is not None and (why := not_a_directory(directory)):
            raise click.UsageError(why)
    policies = parse_queue(queue)
    board = job_board(via, sbatch_args, cancel_on_abort, job_poll)  # --via: scheduler jobs

    def options_for(event: str) -> HookOptions:
        return HookOptions(
            timeout=timeout,
            retries=retries,
            backoff=backoff,
            concurrency=concurrency,
            queue=policies.get(event, policies.get(None)),
            via=via,
        )

    hooks: list[Hook] = []
    consumers: list[Any] = []
    exporters: list[Any] = []
    try:
        pairs = [(k[3:], cmd) for k, cmds in on_event.items() for cmd in cmds] + list(on_pairs)
        for event, cmd in pairs:
            if event not in EVENTS:
                raise CallbackSpecError(f"unknown event {event!r}; known: {', '.join(EVENTS)}")
            hooks.append(hook_for(event, cmd, options_for(event), shell=shell))
        # InstructLab's and training_hub's callbacks run as their trainers would call them
        objects = adapt([instantiate(load_object(spec), spec) for spec in callbacks])
        if early_stopping is not None:
            objects.append(parse_builtin("early-stopping", early_stopping))
        if divergence is not None:
            objects.append(parse_builtin("divergence", divergence))
        for obj in objects:
            hooks.extend(hooks_for_object(obj, options_for))
            if callable(getattr(obj, "restore_state", None)):
                consumers.append(obj)
        for exporter in exporters_for(
            ckpt_dir, tensorboard_dir, mlflow_uri, mlflow_log_artifacts, wandb
        ):
            exporters.append(exporter)  # closed (flushed, W&B run finished) at the end
            hooks.extend(hooks_for_object(exporter, every_record(options_for)))
    except CallbackSpecError as exc:
        raise click.UsageError(str(exc)) from None
    if board is not None:
        if not pairs:
            raise click.UsageError(f"--via {via} runs command hooks: give --on-save CMD")
        if cancel_on_abort:
            hooks.append(abort_hook(board, lambda e: replace(options_for(e), via=None)))
    mirror = open_mirror(
        ckpt_dir, mirror_uri, follow=not replay, lease_ttl=lease_ttl, linger=linger
    )
    if not hooks and mirror is None:
        raise click.UsageError(
            "nothing to run: give --on-save CMD, --on EVENT CMD, --callback MODULE:OBJ, "
            "--tensorboard LOGDIR, --mlflow, --wandb or --mirror URI"
        )

    if poll is None and (fstype := needs_polling(journal.parent)):
        poll = 1.0
        click.echo(
            f"ilab-watch: {journal.parent} is on {fstype}; polling every {poll:g}s "
            "(filesystem events are unreliable there)",
            err=True,
        )
    if not ckpt_dir.exists():
        click.echo(f"ilab-watch: waiting for {ckpt_dir} to appear", err=True)
    try:  # it writes leases, reports and control files there, and kills what it recorded
        check_run_dir(ckpt_dir)
    except UnsafeRunDir as exc:
        raise click.UsageError(str(exc)) from None
    if mirror is not None and not hooks:
        sys.exit(run_alone(mirror, quiet))
    from watcher.engine.console import ConsoleReporter

    name = name or default_name(hooks)
    watcher = Watcher(
        journal,
        hooks,
        name=name,
        state_dir=state_dir or watch_dir(ckpt_dir),
        start="now" if start == "now" else "start",
        follow=not replay,
        poll=poll,
        reporter=_unless_said(ConsoleReporter(quiet=quiet, verbose=verbose > 0)),
        stateful_callbacks=consumers,
        lease_ttl=lease_ttl,
        jobs=partial(JobRunner, board) if board is not None else None,  # --via
    )
    try:  # one process per cursor, as one launch per run dir: exit 3 names the other one
        watcher.claim()
    except CursorBusy as exc:
        close_all(exporters)
        click.echo(f"ilab-watch: {exc}", err=True)
        sys.exit(3)
    except UnsafeRunDir as exc:
        raise click.UsageError(str(exc)) from None
    interrupted: list[int] = []

    def on_signal(signum: int, _frame: Any) -> None:
        interrupted.append(signum)
        watcher.request_stop()
        if mirror is not None:
            mirror.stop()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    if not quiet:
        click.echo(
            f"ilab-watch: {len(hooks)} hook(s) on {journal} (cursor '{name}', "
            f"{'poll ' + format(poll, 'g') + 's' if poll else 'watchdog'})",
            err=True,
        )
    if mirror is not None:
        mirror.start()
    code = watcher.run()
    if remote is not None:
        remote.finish()  # the last reports and commands reach the store
    if mirror is not None:
        code = max(code, mirror.finish(quiet))
    close_all(exporters)
    if board is not None:
        board.close()
        if not interrupted:
            board.finish()
    if interrupted:
        sys.exit(130)
    n_ok, n_skipped = watcher.count("ok"), watcher.count("skipped")
    if not quiet:
        skipped = skipped_words(n_skipped, board)
        lost = watcher.completions.unrecorded
        where = (
            f"the results of {lost} deliveries could not be saved in {watcher.results_path}"
            if lost
            else f"results in {watcher.results_path}"
        )
        click.echo(
            f"ilab-watch: done: {n_ok} ok, {watcher.failed_final} failed{skipped}; {where}",
            err=True,
        )
    sys.exit(code)


if __name__ == "__main__":
    main()
