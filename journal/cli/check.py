"""``ilab-journal check RUN --expect EXPR ...``: a CI or cron gate on a run in one line."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from journal.cli.common import (
    Seconds,
    UserError,
    as_user_error,
    dumps,
    require_journal,
    stale_after_option,
    user_errors,
)
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.paths import resolve_journal

if TYPE_CHECKING:
    from journal.ask.expect import Expectation
    from journal.ask.settle import RunReading

#: --wait's seconds when given without a number; --quiet's default.
DEFAULT_WAIT_S = 3600.0
DEFAULT_QUIET_S = 10.0
#: States in which a run cannot be judged: status's exit code is check's.
UNJUDGED = frozenset({"running", "starting", "stale", "empty"})


@click.command()
@click.argument("run", metavar="RUN_DIR|URI", type=RUN_DIR_OR_URI)
@click.option(
    "--expect",
    "-e",
    "exprs",
    multiple=True,
    required=True,
    metavar="EXPR",
    help="A test that must hold, e.g. 'best(accuracy) >= 0.9' (repeat it: all must hold). "
    "Grammar and names: docs/cli.md, 'check'.",
)
@click.option(
    "--wait",
    type=Seconds(),
    is_flag=False,
    flag_value=DEFAULT_WAIT_S,
    default=None,
    metavar="[SECONDS]",
    help="Wait until the run exists and started (its dir or journal not there yet, a "
    "launcher starting it), ended (train_end), no scheduler job is in flight, no "
    f"checkpoint is leased and no record came for --quiet seconds; at most SECONDS "
    f"(default {DEFAULT_WAIT_S:g}).",
)
@click.option(
    "--quiet",
    type=Seconds(),
    default=DEFAULT_QUIET_S,
    show_default=True,
    help="Seconds without a new record after train_end before the run is settled: --wait "
    "judges then; a metric never seen is refused as unknown only then.",
)
@stale_after_option
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@user_errors
def check(
    run: str,
    exprs: tuple[str, ...],
    wait: float | None,
    quiet: float,
    stale_after: float,
    as_json: bool,
) -> None:
    """Judge a run by expectations: exit 0 when all hold, 1 when one fails.

    \b
    ilab-journal check RUN --wait -e 'status in (completed, stopped)' \\
        -e 'best(accuracy) >= 0.9' -e 'refused_reports == 0'

    \b
    Facts: status, steps, max_steps, epoch, samples, records, invalid_lines,
      reports, refused_reports, unapplied_commands, stop_source (eval,
      early_stopping, divergence, callback, hook, web, operator, trainer,
      signal, hang; none), stopped_by, stop_reason, run_id, attempt, alerts.
    Of a metric M: best(M) (or best(M:max)), last(M), first(M), min(M), max(M),
      reports(M), count(M). Compare with == != < <= > >= and in (a, b);
      combine with and, or, not, (...). A bare word is a string only on the
      right of a string fact (status == completed) or in (...); an unknown
      fact, function, status or stop_source word is refused (did you mean ...).

    \b
    Exit codes:
      0  every expectation holds      1  one or more fail (each printed with its values)
      2  usage error: a bad expression, not a run (even after --wait), a metric
         the ended and settled run never had (one line)
      3  running or starting, 6 stale, 7 empty: the run cannot be judged (as status)
    """
    from journal.ask.expect import ExpectError, parse
    from journal.ask.facts import FactFolder
    from journal.ask.settle import read_run, wait_for_journal
    from journal.channels.control import unapplied_commands
    from journal.record.text import printable
    from journal.rundir.lock import run_holder
    from journal.rundir.paths import JournalNotFound

    with as_user_error(ExpectError):
        expectations = [parse(text) for text in exprs]
    path = resolve_journal(run, must_exist=False)
    waited = f" after waiting {wait:g}s" if wait is not None else ""
    if wait is not None and not path.exists():  # not there yet: wait for it, same deadline
        deadline = time.monotonic() + wait
        line = f"check: waiting for {run} to start (its {path.name}), at most {wait:g}s"
        click.echo(printable(line), err=True)
        wait_for_journal(path, deadline)
        wait = max(0.0, deadline - time.monotonic())
    if not path.exists() and path.parent.is_dir() and run_holder(path.parent):
        _unjudged("starting", f"{run}: starting (no record yet){waited}", as_json, path)
    try:
        path = resolve_journal(run)
    except JournalNotFound as exc:  # never seen (even after --wait): a usage error, as status
        raise UserError(f"{exc}{waited}") from None
    metrics = set().union(*(e.metrics for e in expectations))
    reading, pending = read_run(path, FactFolder(metrics, path.parent), wait=wait, quiet=quiet)
    folder = reading.folder
    require_journal(path, folder.fold.summarizer.summary.records, reading.invalid)
    s = folder.fold.summary(stale_after=stale_after)
    s.invalid_lines = reading.invalid
    s.unapplied_commands = len(unapplied_commands(path.parent)[1])
    names = [r.name for e in expectations for r in e.refs]
    facts = folder.facts(s, names)
    if s.state in UNJUDGED:
        _unjudged(s.state, f"{path.parent}: {s.state}{waited}: cannot judge", as_json, path)
    if missing := {m for m in metrics if not folder.values[m].values}:
        _unknown_metrics(reading, missing, expectations, s.keep_best, pending, wait, quiet)
    results = [(e.text, e.holds(facts), e.values(facts)) for e in expectations]
    ok = all(h for _, h, _ in results)
    if as_json:
        click.echo(
            dumps(
                {
                    "journal": str(path),
                    "state": s.state,
                    "holds": ok,
                    "pending": pending,
                    "expectations": [{"expect": t, "holds": h, "values": v} for t, h, v in results],
                }
            )
        )
    else:
        for text, holds, values in results:
            shown = ", ".join(f"{k} = {_show(v)}" for k, v in values.items())
            click.echo(f"{'ok  ' if holds else 'FAIL'}  {text}  ({shown})")
    if pending:  # --wait ran out: judged on what came, and said so
        click.echo(f"check: judged while still pending: {'; '.join(pending)}", err=True)
    sys.exit(0 if ok else 1)


def _unknown_metrics(
    reading: RunReading,
    missing: set[str],
    expectations: list[Expectation],
    keep_best: str | None,
    pending: list[str],
    wait: float | None,
    quiet: float,
) -> None:
    """Metrics named but with no value in the run: a misspelt one, or one still to come.
    A run that ended and settled (nothing pending, as --wait judges it) will never have
    it: a usage error naming the closest metric it has. Else (a report can still land: the
    quiet period, a job, a lease) it is "not yet": judged as none (fails every bound), and
    said on stderr."""
    from journal.ask.facts import known_metrics
    from journal.ask.names import unknown_metric
    from journal.record.text import printable

    known = known_metrics(reading.path, keep_best)
    refs = {
        r.metric.metric.partition(":")[0]: r.name for e in expectations for r in e.refs if r.metric
    }
    if wait is None:  # not waited: settled by the same rule --wait would apply now
        pending = reading.pending(quiet, time.time())
    for metric in sorted(missing - known):  # known: keep_best's metric, with no report yet
        line = unknown_metric(refs[metric], metric, known)
        if not pending:
            raise UserError(line)
        click.echo(printable(f"check: {line}; the run is not settled: judged as none"), err=True)


def _show(v: object) -> str:
    if v is None:
        return "none"
    return f"{v:.6g}" if isinstance(v, float) else str(v)


def _unjudged(state: str, line: str, as_json: bool, path: Path) -> None:
    from journal.record.text import printable
    from journal.views.summary import STATE_EXIT_CODES

    if as_json:
        click.echo(dumps({"journal": str(path), "state": state, "holds": None}))
    else:
        click.echo(printable(line), err=True)
    sys.exit(STATE_EXIT_CODES[state])
