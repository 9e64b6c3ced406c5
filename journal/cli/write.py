"""``ilab-journal`` commands that write: control commands, reports, leases and pruning.

Each is safe beside a running trainer: commands, reports and leases are files created
atomically in the checkpoint dir; only the journal's current writer appends to the journal.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from journal.checkpoints.leases import MAX_TTL_S
from journal.cli.common import Seconds, UserError, as_user_error, user_errors
from journal.record.events import CONTROL_COMMANDS
from journal.record.text import printable
from journal.rundir.paths import JOURNAL_NAME, checkpoint_step, ckpt_dir_of, resolve_journal

# -- control --------------------------------------------------------------------------------


WAIT_DEFAULT_S = 300.0  # ``control --wait`` without SECONDS


@click.command()
@click.argument("command", type=click.Choice(CONTROL_COMMANDS))
@click.argument("dir", type=click.Path())
@click.option("--reason", help="Why; recorded in the journal's control record.")
@click.option(
    "--source",
    help="Who asks (default: host:pid; in a watcher hook: hook:EVENT:DELIVERY_ID). It says "
    "who stopped a run in status's stop_source: start it with eval: for an eval.",
)
@click.option(
    "--id",
    "command_id",
    help="Command id: 1 to 200 letters, digits and _.:@+=- (default: a fresh unique id).",
)
@click.option(
    "--wait",
    type=Seconds(high=86400),
    is_flag=False,
    flag_value=WAIT_DEFAULT_S,
    default=None,
    metavar="[SECONDS]",
    help=f"Wait for the trainer's verdict (default {WAIT_DEFAULT_S:.0f} s) and print it; "
    "exit 0 applied, 1 rejected, 124 no verdict.",
)
@user_errors
def control(
    command: str,
    dir: str,
    reason: str | None,
    source: str | None,
    command_id: str | None,
    wait: float | None,
) -> None:
    """Ask a running trainer to act at its next step boundary; print the command id.

    \b
    stop      finish the step, save a final checkpoint, end as "stopped"
    abort     end at the step boundary without saving
    save      save a checkpoint
    evaluate  run validation
    log       write a log record

    DIR is the checkpoint directory. Inside a watcher callback use "$ILAB_CKPT_DIR".
    The outcome appears in the journal as a "control" record (accepted or rejected).
    With --wait, print that outcome instead of the id, in one line, when it comes.
    A run that has ended or died reads no more commands: refused in one line, exit 1
    (journaled as rejected when it ended), nothing left in control/.
    """
    from journal.channels.control import (
        CommandRefused,
        InvalidCommand,
        check_command_id,
        journal_end,
        send_command,
        wait_for_verdict,
    )

    if command_id is not None:  # before anything is read or written
        with as_user_error(InvalidCommand):
            check_command_id(command_id)
    p = _run_dir(dir)
    if not p.is_dir():
        raise UserError(f"{dir}: no such checkpoint directory")
    if command_id is not None:
        _refuse_used_id(p, command_id)
    since = journal_end(p)
    if source is None:  # run by a watcher's command hook: say so (status's stop_source)
        from journal.views.stops import hook_source

        source = hook_source(dict(os.environ))
    try:
        cid = send_command(p, command, reason=reason, source=source, command_id=command_id)
    except InvalidCommand as exc:
        raise UserError(str(exc)) from None
    except CommandRefused as exc:  # the run reads no more: journaled so when it ended
        raise _Refused(printable(f"{exc.command_id or dir}: {exc}")) from None
    except OSError as exc:
        raise UserError(f"cannot write command in {p}: {exc.strerror or exc}") from None
    if wait is None:
        click.echo(cid)
        return
    verdict = wait_for_verdict(p, cid, timeout=wait, since=since)
    click.echo(verdict.line(cid, command, waited=wait, run_dir=p))
    raise SystemExit(verdict.exit_code)


class _Refused(UserError):
    """A command refused for what the run is (not a usage mistake): one line, exit 1."""

    exit_code = 1


def _refuse_used_id(run_dir: Path, command_id: str) -> None:
    """An id is applied at most once per run dir: a reused one would be dropped unread."""
    from journal.read.reader import iter_events

    path = run_dir / JOURNAL_NAME
    for rec in iter_events(path, {"control"}) if path.exists() else ():
        if rec["data"].get("id") == command_id:
            raise UserError(
                f"--id {command_id}: already used in {run_dir} (a command id is acted on once)"
            )


@click.command()
@click.argument("dir", type=click.Path())
@click.argument("metrics", nargs=-1, metavar="NAME=VALUE...")
@click.option(
    "--checkpoint", help="The checkpoint the results belong to [default: $ILAB_CHECKPOINT_PATH]."
)
@click.option(
    "--step",
    type=click.IntRange(min=0),
    help="Its step [default: $ILAB_STEP, else from the checkpoint's name].",
)
@click.option("--source", help="Who reports (default: host:pid).")
@user_errors
def report(
    dir: str, metrics: tuple[str, ...], checkpoint: str | None, step: int | None, source: str | None
) -> None:
    """Record results for a checkpoint (e.g. from an eval run by ilab-watch); print the id.

    \b
    Example, inside an ilab-watch --on-save command:
      ilab-journal report "$ILAB_CKPT_DIR" accuracy=0.81 pass_at_1=0.42

    Values are numbers, true/false, or text. The report becomes a "report" record in the
    journal: right away when training is over, else at the trainer's next step boundary.
    With --keep-best the named metric must be a number. --checkpoint must be a checkpoint
    of this run on disk now (its path, or its name: step-000040); a path elsewhere, or a
    checkpoint never saved or already removed, is refused.
    """
    from journal.channels.reports import InvalidReport, Report, parse_assignments, submit_report
    from journal.views.best import MetricGoal
    from journal.views.query import find_last

    path = resolve_journal(dir)  # it must exist
    _run_dir(dir)
    with as_user_error(InvalidReport):
        values = parse_assignments(metrics)
    checkpoint = checkpoint or os.environ.get("ILAB_CHECKPOINT_PATH") or None
    if step is None:
        step = _default_step(checkpoint)
    begin = find_last(path, "train_begin")
    config = (begin["data"].get("config") if begin else None) or {}
    keep_best = config.get("keep_best")
    if keep_best:
        goal = MetricGoal.parse(keep_best)
        value = values.get(goal.metric)
        if goal.metric in values and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            raise UserError(
                f"{goal.metric}={value!r}: the run keeps the best checkpoint by {goal}, "
                "so this metric must be a number"
            )
    with as_user_error(InvalidReport):  # a checkpoint of another run or not on disk, over 64 KiB
        rid = submit_report(
            path.parent,
            Report(values, checkpoint_path=checkpoint, step=step),
            source=source,
            delivery_id=os.environ.get("ILAB_DELIVERY_ID") or None,
        )
    click.echo(rid)


def _default_step(checkpoint: str | None) -> int | None:
    env = os.environ.get("ILAB_STEP", "")
    if env.isdigit():
        return int(env)
    return checkpoint_step(Path(checkpoint).name) if checkpoint else None


@click.command()
@click.argument("dir", type=click.Path())
@user_errors
def prune(dir: str) -> None:
    """Apply the run's rotation policy now: print each checkpoint removed.

    The trainer rotates after every save (keeping --keep-last-n, the --keep-best one and
    leased ones). Checkpoints kept for a lease at the last save are removed by the watcher
    that releases the lease; this does the same by hand, and is the only way once a lease's
    holder died (a watcher killed with kill -9: its leases expire, but nothing rotates after
    the run; `status` names those checkpoints). A lease that has not expired keeps its
    checkpoint. Nothing happens while a trainer is writing the journal.
    """
    from journal.rundir.lock import lock_holder
    from journal.store import prune_finished_run

    resolve_journal(dir)  # it must exist
    ckpt_dir = _run_dir(dir)
    if lock_holder(ckpt_dir):
        click.echo(f"{ckpt_dir}: a trainer is writing; it rotates at its next save", err=True)
        return
    for path in prune_finished_run(ckpt_dir, role="ilab-journal prune"):
        click.echo(str(path))


@click.command()
@click.argument("dir", type=click.Path())
@click.argument("checkpoint")
@click.option(
    "--ttl",
    type=Seconds(1, MAX_TTL_S),
    default=3600.0,
    show_default=True,
    help="Seconds until the lease expires unless released (1 to 2592000, i.e. 30 days).",
)
@user_errors
def lease(dir: str, checkpoint: str, ttl: float) -> None:
    """Keep CHECKPOINT from rotation until released or expired; print the lease id.

    For hand-offs to jobs that outlive the callback (e.g. sbatch eval.sh): lease, pass
    the id on, and have the job run `ilab-journal release DIR ID` when done. CHECKPOINT is
    a checkpoint directory of the run or its name (step-000040), or a Lightning .ckpt file
    inside DIR (a path, or relative to DIR).
    """
    from journal.checkpoints.leases import LeaseError, acquire

    ckpt_dir = _run_dir(dir)
    with as_user_error(LeaseError):
        held = acquire(ckpt_dir, checkpoint, ttl=ttl)
    click.echo(held.id)


@click.command()
@click.argument("dir", type=click.Path())
@click.argument("lease_id")
@user_errors
def release(dir: str, lease_id: str) -> None:
    """End a lease taken with `ilab-journal lease`; rotation may then remove the checkpoint."""
    from journal.checkpoints.leases import LeaseError
    from journal.checkpoints.leases import release as release_lease

    with as_user_error(LeaseError):
        release_lease(_run_dir(dir), lease_id)


def _run_dir(dir: str) -> Path:
    """The run dir a write command drops files into (given as itself or as its
    ``journal.jsonl``): refused (one line, exit 2) when it cannot be one, and when another
    user could steer it (journal.rundir.safety). Any other file is refused: its directory's
    journal would be another file, maybe a new one."""
    from journal.rundir.safety import check_run_dir, not_a_directory

    given = Path(dir)
    if given.is_file() and given.name != JOURNAL_NAME:  # e.g. a typo'd run dir that is a file
        raise UserError(f"{dir}: a file, neither a run dir nor its {JOURNAL_NAME}")
    path = ckpt_dir_of(dir)
    if why := not_a_directory(path):
        raise UserError(why)
    check_run_dir(path)
    return path
