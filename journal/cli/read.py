"""``ilab-journal``'s reading commands: ``show``, ``tail`` and ``query`` (imported when
named: journal/cli/main.py), and what they share beyond journal/cli/common.py: printing
records, event names given by the user (``-e`` taking several), the journal that ``tail
-f`` waits for, and values printed for scripts."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import orjson

from journal.cli.common import Seconds, UserError, dumps, require_journal, scan, user_errors
from journal.cli.format import print_records_table
from journal.record.events import EVENTS
from journal.record.record import Record
from journal.record.text import printable
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.paths import resolve_journal

if TYPE_CHECKING:
    from journal.read.reader import InvalidLine


def show_all(path: Path, wanted: set[str], as_json: bool) -> None:
    """``show`` without --last/--since-step: every record (of ``wanted`` events, if any),
    each skipped line named on stderr."""
    out: list[Record] = []
    valid = 0
    skipped: list[InvalidLine] = []
    for records, bad in scan(path):
        valid += len(records)
        skipped.extend(bad)
        out.extend(r for r in records if not wanted or r["event"] in wanted)
    require_journal(path, valid, len(skipped))
    for line in skipped:
        click.echo(f"warning: {path}:{line.line_no}: skipped: {line.reason}", err=True)
    check_events(wanted, out)
    print_records(out, as_json)


def check_events(wanted: set[str] | tuple[str, ...], found: list[Record]) -> None:
    """An event name that is not one of ours and matched no record is a typo: exit 2. (A
    name we do not know that the journal holds is a newer writer's event: shown.)"""
    seen = {r["event"] for r in found}
    unknown = sorted(e for e in wanted if e not in EVENTS and e not in seen)
    if unknown:
        raise UserError(unknown_event(unknown[0]))


def unknown_event(name: str) -> str:
    """One line for an event name we do not know, with the nearest known one."""
    import difflib

    close = difflib.get_close_matches(name, EVENTS, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return printable(f"unknown event {name!r}: {hint}events are {', '.join(EVENTS)}")


def print_records(records: list[Record], as_json: bool) -> None:
    """Records as JSONL (as recorded, with the defaults of any envelope field a writer left
    out: docs/journal-format.md, "Envelope") or as a table for people."""
    if as_json:
        w = sys.stdout.buffer
        for rec in records:
            w.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
        w.flush()
        return
    print_records_table(records)


def journal_to_follow(dir: str) -> Path:
    """The journal ``tail -f`` follows: DIR's (or DIR itself, a file or a ``*.jsonl`` path).
    One that does not exist yet is waited for, with one line saying so."""
    path = resolve_journal(dir, must_exist=False)
    if path.exists():
        return resolve_journal(path)
    click.echo(f"waiting for {path} (the run has not started yet; Ctrl-C to stop)", err=True)
    return path


def echo_value(text: str) -> None:
    """A value for a script, exactly as recorded; on a terminal, control characters are
    shown instead (a record's text never drives the terminal, as ``ls`` does for names).
    Not ``click.echo``: it would drop what looks like a colour code from the value."""
    sys.stdout.write((printable(text) if sys.stdout.isatty() else text) + "\n")
    sys.stdout.flush()


class ManyEventsCommand(click.Command):
    """A command whose ``-e``/``--event`` takes every word that follows it, up to the next
    option: ``show DIR -e save report`` is ``show DIR -e save -e report`` (both work, as
    the docs write ``[-e EVENT ...]``). click has no option taking a variable number of
    values, so the words are spread over repeated flags before click parses them."""

    greedy: tuple[str, ...] = ("-e", "--event")

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        takes_value = {
            opt
            for p in self.params
            if isinstance(p, click.Option) and not p.is_flag and not p.count
            for opt in p.opts
        }
        return super().parse_args(ctx, spread_values(args, self.greedy, takes_value))


def spread_values(args: list[str], greedy: tuple[str, ...], takes_value: set[str]) -> list[str]:
    """``args`` with the words after a ``greedy`` option each given its own copy of it.

    When no positional argument is left outside those words (``show -e save report
    runs/x``), the last of them is the positional one (DIR), as it would be with one
    event: ``-e save runs/x`` keeps meaning the events ``save`` of ``runs/x``."""
    out: list[str] = []
    added: list[int] = []  # where a copy of the option was put before a word
    positional = False
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            positional = positional or i < len(args)
            out += args[i - 1 :]
            break
        attached = any(  # --event=save, -esave: the first value in the same word
            arg.startswith(f"{g}=") if g.startswith("--") else arg.startswith(g) and arg != g
            for g in greedy
        )
        if arg in greedy or attached:
            out.append(arg)
            if not attached and i < len(args):  # its first value, whatever it looks like
                out.append(args[i])
                i += 1
            while i < len(args) and not args[i].startswith("-"):
                added.append(len(out))
                out += [greedy[0], args[i]]
                i += 1
        elif arg in takes_value:
            out += args[i - 1 : i + 1]
            i += 1
        else:
            positional = positional or not arg.startswith("-") or arg == "-"
            out.append(arg)
    if not positional and added:
        del out[added[-1]]  # that word is DIR
    return out


# -- show -----------------------------------------------------------------------------------


@click.command(cls=ManyEventsCommand)
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
    "--since-step", type=click.IntRange(min=0), help="Only records at or after this step."
)
@click.option(
    "--last", "last_n", type=click.IntRange(min=1), help="Only the last N matching records."
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


@click.command()
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


@click.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--event", "-e", help="Event name, e.g. save.")
@click.option(
    "--best",
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
    from journal.store import tail
    from journal.views.query import find_best, find_first, find_last, get_field, is_missing

    if (event is None) == (best is None):
        raise UserError("give exactly one of --event EVENT and --best METRIC:max|min")
    path = resolve_journal(dir)
    if best is not None:
        from journal.cli.common import as_user_error
        from journal.views.best import MetricGoal

        with as_user_error(ValueError):
            goal = MetricGoal.parse(best)
        top = find_best(path, goal, run_id=tail(path).run_id)  # the journal's run only
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
