"""``ilab-journal tail``: the newest records, and a live view that follows a run."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from journal.cli.format import fmt_ts, summarize_data
from journal.read.tailing import RotatingReader
from journal.record.record import Record
from journal.record.text import printable
from journal.rundir.ledger import claims
from journal.rundir.lock import writer_gone
from journal.store import follow as follow_store
from journal.views import index
from journal.views.query import last_records
from journal.views.summary import STATE_EXIT_CODES, Summarizer


def _line(rec: Record) -> str:
    """One record as one line of plain text (control characters shown, not obeyed)."""
    ev = rec["event"]
    return printable(
        f"{fmt_ts(rec['ts'])} step {rec['step']:>6} {ev:<22} {summarize_data(ev, rec['data'])}"
    )


#: Records the live view prints as lines above the progress bar.
_SHOWN = frozenset(
    {"save", "evaluate", "control", "report", "checkpoint_removed", "train_begin", "train_end"}
)


def follow_journal(
    path: Path, *, follow: bool, first_n: int, interval: float, as_json: bool
) -> int:
    """Print the last ``first_n`` records; with ``follow``, keep going until ``train_end``.

    Returns the exit code (the ``status`` code of the final state when following).
    """
    emit = (
        (lambda r: sys.stdout.write(orjson.dumps(r).decode() + "\n"))
        if as_json
        else (lambda r: print(_line(r)))
    )
    if not follow:  # the newest records only: read backwards, the cost follows N
        records, bad = last_records(path, first_n) if first_n > 0 else ([], [])
        for offset, reason in reversed(bad):
            print(f"warning: {path}: byte {offset}: skipped: {reason}", file=sys.stderr)
        for rec in records:
            emit(rec)
        sys.stdout.flush()
        return 0
    # Start-up costs what is new since the index, not the whole file: the summary (progress,
    # state) from the index plus the tail, the first records read backwards from there.
    folded = index.advance(path, None)
    reader = follow_store(path, folded.cursor)  # holds the file now: a rotation loses nothing
    if first_n > 0:
        for rec in last_records(path, first_n, end=folded.cursor.offset)[0]:
            emit(rec)
    sys.stdout.flush()
    summ, died = folded.fold.summarizer, list[str]()
    shown = {a.id for a in folded.fold.alerts}  # journaled: a raised one is said once
    batches = _batches(reader, summ, interval, path.parent, died, shown)
    if as_json or not sys.stdout.isatty():
        for records in batches:
            for rec in records:
                emit(rec)
            sys.stdout.flush()
    else:
        _live_view(batches, summ)
    for line in died:
        print(printable(line), file=sys.stderr)
    return STATE_EXIT_CODES.get("stale" if died else summ.summary.state, 1)


#: How often a quiet follower asks whether anybody is left to write the journal.
DEATH_CHECK_S = 1.0


def _batches(
    reader: RotatingReader,
    summ: Summarizer,
    interval: float,
    run_dir: Path,
    died: list[str],
    shown: set[Any],
) -> Iterator[list[Record]]:
    """What the journal gains (across mv and copytruncate), folded into ``summ``, until
    ``train_end``, or until the run is known dead: no ``train_end``, and nobody left to
    write one (:func:`~journal.rundir.lock.writer_gone`), said in ``died``. While it is
    quiet, an alert raised that the journal has not got (``shown``: the ids said) is one
    line on stderr: a trainer hung holding the journal journals its hang alert never."""
    gone, look = False, time.monotonic() + DEATH_CHECK_S
    while not summ.ended:
        reader.check()
        records = reader.read().records
        for rec in records:
            summ.add(rec)
            if rec["event"] == "alert":
                shown.add(rec["data"].get("id"))
        yield records
        if records:
            gone = False
        elif gone:  # nothing came since nobody was left to write: no train_end will
            step = summ.summary.last_step
            died.append(f"{run_dir}: the run died at step {step}: no train_end, and nothing "
                        "holds it to write one")  # fmt: skip
            return
        elif time.monotonic() >= look:  # gone: one more read (records just before it let go)
            gone, look = writer_gone(run_dir), time.monotonic() + DEATH_CHECK_S
            for c in claims(run_dir, summ.summary.run_id):
                if c.get("id") not in shown:  # a raised alert the journal has not got yet
                    shown.add(c.get("id"))
                    what = summarize_data("alert", {**c, "kind": c.get("alert")}, 200)
                    line = f"{fmt_ts(c.get('raised_at'))} alert (not in the journal yet) {what}"
                    print(printable(line), file=sys.stderr)
        else:
            time.sleep(interval)  # a person's view: polling is plenty


def _live_view(batches: Iterator[list[Record]], summ: Summarizer) -> None:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.text import Text

    console = Console()
    progress = Progress(
        TextColumn("[bold]step"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    task = progress.add_task(
        "train", total=summ.summary.total_steps or None, completed=summ.summary.last_step
    )
    tput: dict[str, Any] = {}

    def status_line() -> Text:
        s = summ.summary
        parts = [f"state {s.state}"]
        if s.last_loss is not None:
            parts.append(f"loss {s.last_loss:.4f}")
        if s.last_lr is not None:
            parts.append(f"lr {s.last_lr:.2e}")
        if tput.get("tokens_per_s"):
            parts.append(f"{tput['tokens_per_s']:.0f} tok/s")
        if s.last_val_loss is not None:
            parts.append(f"val_loss {s.last_val_loss:.4f}")
        parts.append(f"ckpt {s.last_checkpoint or '-'}")
        return Text(printable("  ".join(parts)))

    with Live(Group(progress, status_line()), console=console, refresh_per_second=8) as live:
        for records in batches:
            for rec in records:
                ev = rec["event"]
                if ev == "log":
                    tput["tokens_per_s"] = rec["data"].get("tokens_per_s")
                if ev in _SHOWN:
                    console.print(Text(_line(rec)))  # Text: never read as markup
            progress.update(
                task, total=summ.summary.total_steps or None, completed=summ.summary.last_step
            )
            live.update(Group(progress, status_line()))
    if summ.ended:
        reason = f" ({summ.summary.reason})" if summ.summary.reason else ""
        console.print(Text(printable(f"run ended: {summ.summary.state}{reason}")))
