"""What ``ilab-journal``'s reading commands (status, show, tail, query) share beyond
journal/cli/common.py: printing records, event names given by the user (``-e`` taking
several), the journal that ``tail -f`` waits for, values printed for scripts, and what
``status`` says of checkpoints left beyond retention."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
import orjson

from journal.cli.common import UserError, require_journal, scan
from journal.cli.format import print_records_table
from journal.record.events import EVENTS
from journal.record.record import Record
from journal.record.text import printable
from journal.rundir.paths import resolve_journal

if TYPE_CHECKING:
    from journal.read.reader import InvalidLine
    from journal.views.summary import RunSummary


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


def add_retention(s: RunSummary, ckpt_dir: Path) -> None:
    """An ended run's checkpoints beyond keep_last_n that nothing holds any more: the
    trainer rotates no more, and a lease holder that died (a watcher killed with ``kill
    -9``) never releases; said by ``status``, removed by ``prune``. A running trainer
    rotates them at its next save. Cost: the run's checkpoint and lease dirs, not the
    journal."""
    if s.state in ("running", "starting", "empty") or not s.keep_last_n:
        return
    from journal.checkpoints.rotation import prunable  # only for a run that rotates

    best = (s.best_checkpoint or {}).get("checkpoint_path")
    keep = {Path(best).name} if isinstance(best, str) else set()
    paths, s.expired_leases = prunable(ckpt_dir, s.keep_last_n, keep=keep, run_id=s.run_id)
    s.prunable_checkpoints = [str(p) for p in paths]
