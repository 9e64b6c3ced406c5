"""``ilab-watch``: run callbacks on journal events, beside (not inside) training."""

from __future__ import annotations

import gc
import hashlib
import itertools
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

import click

from journal.rundir.paths import resolve_journal
from journal.rundir.safety import UnsafeRunDir, check_run_dir, not_a_directory
from watcher.alerts.guard import GuardOptions, OnHang
from watcher.alerts.guard_options import check_on_hang, start_guard
from watcher.alerts.hang import HangRule
from watcher.alerts.options import open_alerts
from watcher.assembly import WatchPlan, assemble
from watcher.cli.hooks import build_hooks, callback_objects, hook_options
from watcher.cli.options import parse_queue, watch_options
from watcher.engine.console import ConsoleReporter, PrintableFormatter
from watcher.engine.cursor import CursorBusy
from watcher.engine.engine import Watcher
from watcher.engine.fsinfo import needs_polling
from watcher.engine.signals import StopOnSignal
from watcher.exporters.base import close_all
from watcher.exporters.registry import exporters_for
from watcher.hooks.delivery import already_said
from watcher.hooks.hook import Hook
from watcher.lmeval.options import lm_eval_pairs
from watcher.mirror.options import MirrorRun, open_mirror, run_alone
from watcher.mirror.remote import RemoteFollow, follow_remote
from watcher.scheduler.board import JobBoard
from watcher.scheduler.options import job_board, skipped_words
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


# -- main's steps, in the order it takes them -----------------------------------------------


def _set_up_process(verbose: int) -> None:
    """The garbage collector's pace and the console's log lines."""
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


def _locate(
    dir: Path | str,
    download_dir: Path | None,
    poll: float | None,
    replay: bool,
    state_dir: Path | None,
    tensorboard_dir: Path | None,
) -> tuple[RemoteFollow | None, Path]:
    """The journal to follow (and for a URI, the replica it is followed through); the
    directories given that can never be used are usage errors."""
    remote = follow_remote(dir, download_dir, poll)  # a URI: followed through a replica
    run_dir = remote.dir if remote is not None else Path(dir)
    journal = resolve_journal(run_dir, must_exist=False)  # followed, it may not exist yet
    if replay and not journal.is_file():
        raise click.UsageError(f"--replay needs an existing journal; {journal} not found")
    for directory in (journal.parent, state_dir, tensorboard_dir):  # below a file: never starts
        if directory is not None and (why := not_a_directory(directory)):
            raise click.UsageError(why)
    return remote, journal


def _check_run_dir(journal: Path, poll: float | None) -> float | None:
    """Say how the run dir is followed, and refuse an unsafe one; the poll interval (set on
    a file system whose events are unreliable)."""
    ckpt_dir = journal.parent
    if poll is None and (fstype := needs_polling(ckpt_dir)):
        poll = 1.0
        click.echo(
            f"ilab-watch: {ckpt_dir} is on {fstype}; polling every {poll:g}s "
            "(filesystem events are unreliable there)",
            err=True,
        )
    if not ckpt_dir.exists():
        click.echo(f"ilab-watch: waiting for {ckpt_dir} to appear", err=True)
    try:  # it writes leases, reports and control files there, and kills what it recorded
        check_run_dir(ckpt_dir)
    except UnsafeRunDir as exc:
        raise click.UsageError(str(exc)) from None
    return poll


def _run(
    watcher: Watcher,
    poll: float | None,
    quiet: bool,
    *,
    mirror: MirrorRun | None,
    remote: RemoteFollow | None,
) -> tuple[int, bool]:
    """Deliver until the run's end (and the mirror's); the exit code, and whether a signal
    stopped it."""
    mirror_stop = [] if mirror is None else [mirror.mirror.request_stop]
    # every SIGINT/SIGTERM: the same graceful stop
    with StopOnSignal(watcher.request_stop, *mirror_stop) as signals:
        if not quiet:
            click.echo(
                f"ilab-watch: {len(watcher.hooks)} hook(s) on {watcher.journal} (cursor "
                f"'{watcher.name}', {'poll ' + format(poll, 'g') + 's' if poll else 'watchdog'})",
                err=True,
            )
        if mirror is not None:
            mirror.start()
        code = watcher.run()
        if remote is not None:
            remote.finish()  # the last reports and commands reach the store
        if mirror is not None:
            code = max(code, mirror.finish(quiet))
    return code, signals.received


def _summarise(watcher: Watcher, board: JobBoard | None) -> None:
    """The last line: what was delivered, and where the results are."""
    n_ok, n_skipped = watcher.count("ok"), watcher.count("skipped")
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


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@watch_options
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
    lm_eval_tasks: str | None,
    lm_eval_args: str | None,
    lm_eval_limit: float | None,
    lm_eval_include: Path | None,
    via: str | None,
    ray_address: str | None,
    ray_resources: str | None,
    sbatch_args: str | None,
    cancel_on_abort: bool,
    job_poll: float,
    job_env: tuple[str, ...],
    mirror_uri: str | None,
    linger: float,
    download_dir: Path | None,
    notify: tuple[str, ...],
    notify_when: tuple[str, ...],
    notify_on: str | None,
    hang_after: HangRule | None,
    first_step_limit: float | None,
    on_hang: OnHang,  # click's choice of ON_HANG
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
    _set_up_process(verbose)
    remote, journal = _locate(dir, download_dir, poll, replay, state_dir, tensorboard_dir)
    ckpt_dir = journal.parent
    policies = parse_queue(queue)
    # --via: scheduler jobs
    board = job_board(
        via, sbatch_args, cancel_on_abort, job_poll, ray_address, ray_resources, job_env
    )
    options_for = hook_options(policies, timeout, retries, backoff, concurrency, board)
    pairs = [(k[3:], cmd) for k, cmds in on_event.items() for cmd in cmds] + list(on_pairs)
    pairs += lm_eval_pairs(lm_eval_tasks, lm_eval_args, lm_eval_limit, lm_eval_include)
    # --hang-after: a guard beside the hooks, on this machine's live run (docs/alerts.md)
    hang_after = check_on_hang(
        hang_after, on_hang, first_step_limit, remote=remote is not None, replay=replay
    )
    # --notify: alerts journaled and sent (watcher/alerts); its rules are one more hook
    label = str(dir) if remote is not None else str(Path(ckpt_dir).absolute())
    alerting = open_alerts(
        ckpt_dir,
        label,
        notify=notify,
        notify_when=notify_when,
        notify_on=notify_on,
        divergence=divergence,
        always=hang_after is not None,
    )
    built = build_hooks(
        pairs,
        itertools.chain(
            callback_objects(callbacks, early_stopping, divergence),
            [alerting.rules] if alerting is not None else [],
        ),
        exporters_for(ckpt_dir, tensorboard_dir, mlflow_uri, mlflow_log_artifacts, wandb),
        options_for,
        shell=shell,
        board=board,
    )
    mirror = open_mirror(
        ckpt_dir, mirror_uri, follow=not replay, lease_ttl=lease_ttl, linger=linger
    )
    if not built.hooks and mirror is None:
        raise click.UsageError(
            "nothing to run: give --on-save CMD, --on EVENT CMD, --lm-eval TASKS, --callback MODULE:OBJ, "
            "--tensorboard LOGDIR, --mlflow, --wandb, --mirror URI or --notify URL"
        )
    poll = _check_run_dir(journal, poll)
    if mirror is not None and not built.hooks:
        sys.exit(run_alone(mirror, quiet))
    plan = WatchPlan(
        journal,
        built,
        name=name or default_name(built.hooks),
        state_dir=state_dir,
        start="now" if start == "now" else "start",
        follow=not replay,
        poll=poll,
        reporter=_unless_said(ConsoleReporter(quiet=quiet, verbose=verbose > 0)),
        lease_ttl=lease_ttl,
        jobs=partial(JobRunner, board) if board is not None else None,  # --via
    )
    try:  # one process per cursor, as one launch per run dir: exit 3 names the other one
        watcher = assemble(plan)
    except CursorBusy as exc:
        click.echo(f"ilab-watch: {exc}", err=True)
        sys.exit(3)
    except UnsafeRunDir as exc:
        raise click.UsageError(str(exc)) from None
    guard = None
    if alerting is not None and remote is None and not replay:
        kinds = alerting.rules.kinds  # deaths: wherever alerts are raised, unless left out
        options = GuardOptions(hang_after, on_hang, deaths=kinds is None or "died" in kinds)
        guard = start_guard(ckpt_dir, alerting.sink, options)
    code, interrupted = _run(watcher, poll, quiet, mirror=mirror, remote=remote)
    if guard is not None:
        guard.stop()
    if alerting is not None:  # what is still pending reaches its targets, or is given up
        alerting.close()
    close_all(built.exporters)
    if board is not None:
        board.close()
        if not interrupted:
            board.finish()
    if interrupted:
        sys.exit(130)
    if not quiet:
        _summarise(watcher, board)
    sys.exit(code)


if __name__ == "__main__":
    main()
