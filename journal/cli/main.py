"""``ilab-journal``: read and steer a training run from its journal, for people and scripts.

Heavy imports (pydantic, rich, matplotlib) happen inside the commands that need them, so
script-facing commands such as ``query`` start fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import orjson

from journal.cli.common import Seconds, UserError, dumps, require_journal, user_errors
from journal.cli.format import holder_text, stats_text, status_text
from journal.cli.plugins import PluginGroup
from journal.cli.read import (
    ManyEventsCommand,
    add_retention,
    check_events,
    echo_value,
    journal_to_follow,
    print_records,
    show_all,
    unknown_event,
)
from journal.record.events import EVENTS
from journal.record.text import printable
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.lock import run_holder
from journal.rundir.paths import resolve_journal


@click.group(
    cls=PluginGroup,
    lazy_commands={
        "check": "journal.cli.check:check",
        "control": "journal.cli.write:control",
        "export": "journal.cli.export:export",
        "lease": "journal.cli.write:lease",
        "prune": "journal.cli.write:prune",
        "release": "journal.cli.write:release",
        "report": "journal.cli.write:report",
        "serve": "journal.cli.serve:serve",
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="ilab-journal")
def main() -> None:
    """Inspect and steer training runs through their lifecycle journal.

    The trainer (rank 0) appends one JSON record per lifecycle event to
    <ckpt_dir>/journal.jsonl. These commands read it, for people (show, tail, stats, plot)
    and for scripts (status exit codes, query, --json output), and write control commands
    the trainer applies at the next step boundary (control).
    """


# -- status ---------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--stale-after",
    type=Seconds(),
    default=600.0,
    show_default=True,
    help="Seconds without a record (and no train_end) after which a run counts as stale.",
)
@click.option(
    "--full",
    is_flag=True,
    help="Read the whole journal instead of the index (journal.index.json) plus what came "
    "after it. Same answer, slower on long runs.",
)
@user_errors
def status(dir: str, as_json: bool, stale_after: float, full: bool) -> None:
    """Show the state of the latest attempt of a run.

    \b
    Exit codes (for cron/CI):
      0 completed    1 failed      2 usage error (bad DIR, not a journal)
      3 running      4 stopped     5 interrupted
      3 starting     (the launcher holds DIR, no record written yet)
      6 stale        (no record for --stale-after seconds, or the trainer
                      process is gone on this host, and no train_end)
      7 empty        (journal exists but holds no record yet)
    """
    from journal.channels.control import unapplied_commands
    from journal.views.index import summarize
    from journal.views.summary import STATE_EXIT_CODES, RunSummary

    given, path = Path(dir), resolve_journal(dir, must_exist=False)
    if given.is_dir() and not path.exists() and (held := run_holder(given)):
        # A launch in progress that has not written its journal yet: starting, not an error
        s = RunSummary(holder=held)
    else:
        path = resolve_journal(dir)
        folded = summarize(path, use_index=not full)
        run, invalid = folded.fold, folded.invalid
        require_journal(path, run.summarizer.summary.records, invalid)
        s = run.summary(stale_after=stale_after)
        s.invalid_lines = invalid
        s.holder = run_holder(path.parent)
        s.unapplied_commands = len(unapplied_commands(path.parent)[1])
        add_retention(s, path.parent)
    if s.state == "empty" and s.holder:
        s.state, s.reason = "starting", f"held by {holder_text(s.holder)}"
    if as_json:
        click.echo(dumps({**s.to_dict(), "journal": str(path)}))
    else:
        click.echo(status_text(s, path))
    sys.exit(STATE_EXIT_CODES.get(s.state, 1))


# -- show -----------------------------------------------------------------------------------


@main.command(cls=ManyEventsCommand)
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option(
    "--event",
    "-e",
    "events",
    multiple=True,
    metavar="EVENT ...",
    help="Only these events: -e save report (or -e save -e report).",
)
@click.option(
    "--since-step",
    type=click.IntRange(min=0),
    default=None,
    help="Only records at or after this step.",
)
@click.option(
    "--last",
    "last_n",
    type=click.IntRange(min=1),
    default=None,
    help="Only the last N matching records.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSONL (one record per line).")
@user_errors
def show(
    dir: str, events: tuple[str, ...], since_step: int | None, last_n: int | None, as_json: bool
) -> None:
    """Print journal records as a table (or JSONL with --json)."""

    path = resolve_journal(dir)
    wanted = set(events)
    if since_step is None and last_n is None:
        show_all(path, wanted, as_json)
        return
    # Read backwards from the end: the cost follows what is printed, not the file.
    if since_step is not None:
        from journal.views.query import records_since_step

        newest, bad_lines = records_since_step(path, since_step, wanted or None)
        newest = newest[-last_n:] if last_n is not None else newest
    else:
        from journal.views.query import last_records

        newest, bad_lines = last_records(path, last_n or 1, wanted or None)
        if not wanted:  # read to the start without one valid record: not a journal
            require_journal(path, len(newest), len(bad_lines))
    for offset, reason in bad_lines:
        click.echo(f"warning: {path}: byte {offset}: skipped: {reason}", err=True)
    check_events(wanted, newest)
    print_records(newest, as_json)


# -- tail -----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("-f", "--follow", is_flag=True, help="Keep following until train_end.")
@click.option(
    "-n",
    "--lines",
    "n",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="Records to show first.",
)
@click.option(
    "--interval",
    type=Seconds(low_open=True),
    default=0.25,
    show_default=True,
    help="Seconds between checks while following.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSONL instead of a live view.")
@user_errors
def tail(dir: str, follow: bool, n: int, interval: float, as_json: bool) -> None:
    """Show the newest records; with -f, a live view until the run ends.

    The live view shows a progress bar (step / planned steps), loss, lr, throughput and the
    last checkpoint, and ends after train_end. Interrupt with Ctrl-C at any time. A rotated
    journal (mv, copytruncate) is followed without losing or repeating a record.
    """
    from journal.cli.tail import follow_journal

    path = journal_to_follow(dir) if follow else resolve_journal(dir)
    try:
        code = follow_journal(path, follow=follow, first_n=n, interval=interval, as_json=as_json)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


# -- query ----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--event", "-e", default=None, help="Event name, e.g. save.")
@click.option(
    "--best",
    "best",
    default=None,
    metavar="METRIC:max|min",
    help="Instead of an event: the path of the best surviving checkpoint of the journal's "
    "current run by a reported (or evaluate) metric, e.g. accuracy:max.",
)
@click.option(
    "--last", "which", flag_value="last", default=True, help="The newest match (default)."
)
@click.option("--first", "which", flag_value="first", help="The oldest match.")
@click.option(
    "--field",
    "field_name",
    default=None,
    help="Dotted path to print, e.g. checkpoint_path or metrics.accuracy (looked up in the "
    "envelope, then in data). Default: the whole record as JSON.",
)
@user_errors
def query(
    dir: str, event: str | None, best: str | None, which: str, field_name: str | None
) -> None:
    """Print one value for scripts; exit 1 when there is no match.

    \b
    Examples: the newest checkpoint path; the best one by reported accuracy
      ilab-journal query runs/x --event save --field checkpoint_path
      ilab-journal query runs/x --best accuracy:max
    """
    from journal.checkpoints.rotation import journal_run
    from journal.views.query import find_best, find_first, find_last, get_field, is_missing

    if (event is None) == (best is None):
        raise UserError("give exactly one of --event EVENT and --best METRIC:max|min")
    path = resolve_journal(dir)
    if best is not None:
        from journal.views.best import MetricGoal

        try:
            goal = MetricGoal.parse(best)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        top = find_best(path, goal, run_id=journal_run(path))  # the journal's run only
        if top is None:
            click.echo(f"no surviving checkpoint has a {goal.metric!r} value in {path}", err=True)
            sys.exit(1)
        picked = top.to_dict().get(field_name or "checkpoint_path")
        if picked is None:
            click.echo(f"the best checkpoint has no field {field_name!r}", err=True)
            sys.exit(1)
        echo_value(picked if isinstance(picked, str) else dumps(picked))
        return
    assert event is not None
    rec = find_last(path, event) if which == "last" else find_first(path, event)
    if rec is None:
        if event not in EVENTS:
            raise UserError(unknown_event(event))
        click.echo(f"no {event!r} record in {path}", err=True)
        sys.exit(1)
    value: Any = rec if field_name is None else get_field(rec, field_name)
    if is_missing(value):
        click.echo(f"{event!r} record seq {rec['seq']} has no field {field_name!r}", err=True)
        sys.exit(1)
    echo_value(value if isinstance(value, str) else dumps(value))


# -- stats ----------------------------------------------------------------------------------


JOBS_OPTION = click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Processes that scan parts of a large journal at once "
    "[default: one per core, at most 4, one per 16 MB].",
)


@main.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@JOBS_OPTION
@user_errors
def stats(dir: str, as_json: bool, jobs: int | None) -> None:
    """Counts per event, time per phase (step, evaluate, save) and throughput."""
    from journal.views.stats import journal_stats

    path = resolve_journal(dir)
    st, invalid = journal_stats(path, jobs)
    require_journal(path, sum(st.counts.values()), invalid)
    d = st.to_dict()
    d["invalid_lines"] = invalid
    if as_json:
        click.echo(dumps(d))
        return
    click.echo(stats_text(d))


# -- validate -------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
@JOBS_OPTION
@user_errors
def validate(dir: str, as_json: bool, jobs: int | None) -> None:
    """Check every record against the schema, seq order and line integrity.

    Exit 0 when the journal is sound, 1 when anything is corrupt (invalid lines, schema
    violations, seq not strictly increasing, unexplained seq gaps), 2 on usage errors.
    A torn final line (a writer may still be appending) is a warning only.
    """
    from journal.views.validate import validate_journal

    path = resolve_journal(dir)
    report = validate_journal(path, jobs=jobs)
    require_journal(path, report.records, report.invalid_lines)
    problems, count, valid = report.problems, report.problem_count, report.records
    ok = report.ok
    if as_json:
        out = {"ok": ok, "records": valid, "problems": problems, "problem_count": count}
        click.echo(dumps({**out, "warnings": report.warnings}))
    else:
        for w in report.warnings:
            click.echo(f"warning: {printable(w)}", err=True)
        for p in problems[:50]:
            click.echo(f"error: {printable(p)}")
        if count > 50:
            click.echo(f"... and {count - 50} more")
        click.echo(f"{path}: {valid} records, {count} problems: {'OK' if ok else 'CORRUPT'}")
    sys.exit(0 if ok else 1)


# -- schema ---------------------------------------------------------------------------------


@main.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of one journal record."""
    from journal.record.schema import json_schema

    click.echo(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode())


# -- plot -----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG path (default: <ckpt_dir>/journal.png).",
)
@user_errors
def plot(dir: str, output: str | None) -> None:
    """Plot loss, val_loss and learning rate per step to a PNG (needs the 'plot' extra)."""
    from journal.cli.plot import MissingPlotExtra, NothingToPlot, plot_journal

    path = resolve_journal(dir)
    out = Path(output) if output else path.parent / "journal.png"
    try:
        plot_journal(path, out)
    except (MissingPlotExtra, NothingToPlot) as exc:
        raise UserError(str(exc)) from None
    click.echo(str(out))


if __name__ == "__main__":
    main()
