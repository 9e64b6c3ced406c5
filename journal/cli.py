"""``ilab-journal``: read and steer a training run from its journal, for people and scripts.

Heavy imports (pydantic, rich, matplotlib) happen inside the commands that need them, so
script-facing commands such as ``query`` start fast.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from journal.events import CONTROL_COMMANDS, EVENTS, SCHEMA_VERSION
from journal.paths import JournalNotFound, resolve_journal
from journal.reader import InvalidLine, JournalReader, iter_batches

F = TypeVar("F", bound=Callable[..., Any])

DIR_HELP = "DIR is a checkpoint directory or the path of a journal.jsonl file."


class UserError(click.ClickException):
    """One clear line on stderr and exit 2, never a traceback."""

    exit_code = 2


def _user_errors(fn: F) -> F:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JournalNotFound as exc:
            raise UserError(str(exc)) from None
        except (IsADirectoryError, PermissionError, FileNotFoundError) as exc:
            raise UserError(f"{exc.filename}: {exc.strerror}") from None

    return wrapper  # type: ignore[return-value]


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj, default=str).decode()


def _scan(path: Path) -> Iterator[tuple[list[dict[str, Any]], list[InvalidLine]]]:
    for batch in iter_batches(path, final=True):
        yield batch.records, batch.invalid


def _require_journal(path: Path, valid: int, invalid: int) -> None:
    """A non-empty file with no valid record is not a journal: say so."""
    if valid == 0 and invalid > 0:
        raise UserError(f"{path}: not a journal ({invalid} lines, none a valid record)")


def _fmt_ts(ts: Any) -> str:
    if not isinstance(ts, (int, float)):
        return "-"
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def _fmt_num(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summarize_data(event: str, data: dict[str, Any], width: int = 90) -> str:
    """A one-line, human-readable digest of a payload."""
    keys: tuple[str, ...]
    if event == "log":
        keys = ("loss", "lr", "grad_norm", "tokens_per_s", "elapsed_time")
    elif event == "train_begin":
        keys = ("world_size", "device_type", "total_steps", "resumed_from")
    else:
        keys = tuple(k for k, v in data.items() if not isinstance(v, (dict, list)) or k == "kind")
    parts = [f"{k}={_fmt_num(data[k])}" for k in keys if k in data and data[k] is not None]
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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
@click.argument("dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--stale-after",
    type=float,
    default=600.0,
    show_default=True,
    help="Seconds without a record (and no train_end) after which a run counts as stale.",
)
@_user_errors
def status(dir: str, as_json: bool, stale_after: float) -> None:
    """Show the state of the latest attempt of a run.

    \b
    Exit codes (for cron/CI):
      0 completed    1 failed      2 usage error (bad DIR, not a journal)
      3 running      4 stopped     5 interrupted
      6 stale        (no record for --stale-after seconds, or the trainer
                      process is gone on this host, and no train_end)
      7 empty        (journal exists but holds no record yet)
    """
    from journal.summary import STATE_EXIT_CODES, Summarizer

    path = resolve_journal(dir)
    summ = Summarizer()
    invalid = 0
    for records, bad in _scan(path):
        for rec in records:
            summ.add(rec)
        invalid += len(bad)
    _require_journal(path, summ.s.records, invalid)
    s = summ.result(stale_after=stale_after)
    s.invalid_lines = invalid
    if as_json:
        click.echo(_dumps({**s.to_dict(), "journal": str(path)}))
    else:
        progress = f"{s.last_step}" + (f"/{s.total_steps}" if s.total_steps else "")
        rows = [
            ("state", s.state + (f" ({s.reason})" if s.reason else "")),
            ("run", f"{s.run_id} attempt {s.attempt}"),
            ("step", f"{progress}  epoch {s.epoch}  samples {s.samples_seen}"),
            ("loss", _fmt_num(s.last_loss) if s.last_loss is not None else "-"),
            ("val_loss", _fmt_num(s.last_val_loss) if s.last_val_loss is not None else "-"),
            ("checkpoint", s.last_checkpoint or "-"),
            (
                "last record",
                _fmt_ts(s.last_ts)
                + (f" ({time.time() - s.last_ts:.0f}s ago)" if s.last_ts else ""),
            ),
            ("journal", f"{path} ({s.records} records, {invalid} invalid lines)"),
        ]
        if s.error:
            rows.insert(1, ("error", s.error))
        for k, v in rows:
            click.echo(f"{k:>12}  {v}")
    sys.exit(STATE_EXIT_CODES.get(s.state, 1))


# -- show -----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("--event", "-e", "events", multiple=True, help="Only these events (repeatable).")
@click.option("--since-step", type=int, default=None, help="Only records at or after this step.")
@click.option("--last", "last_n", type=int, default=None, help="Only the last N matching records.")
@click.option("--json", "as_json", is_flag=True, help="Print JSONL (one record per line).")
@_user_errors
def show(
    dir: str, events: tuple[str, ...], since_step: int | None, last_n: int | None, as_json: bool
) -> None:
    """Print journal records as a table (or JSONL with --json)."""
    from collections import deque

    path = resolve_journal(dir)
    wanted = set(events)
    out: deque[dict[str, Any]] = deque(maxlen=last_n if last_n and last_n > 0 else None)
    valid = 0
    skipped: list[InvalidLine] = []
    for records, bad in _scan(path):
        valid += len(records)
        skipped.extend(bad)
        for rec in records:
            if wanted and rec.get("event") not in wanted:
                continue
            if since_step is not None and rec.get("step", 0) < since_step:
                continue
            out.append(rec)
    _require_journal(path, valid, len(skipped))
    for line in skipped:
        click.echo(f"warning: {path}:{line.line_no}: skipped: {line.reason}", err=True)
    if as_json:
        w = sys.stdout.buffer
        for rec in out:
            w.write(orjson.dumps(rec, option=orjson.OPT_APPEND_NEWLINE))
        w.flush()
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col, just in (
        ("seq", "right"),
        ("time", "left"),
        ("att", "right"),
        ("step", "right"),
        ("ep", "right"),
        ("event", "left"),
        ("data", "left"),
    ):
        table.add_column(col, justify=just, no_wrap=col != "data")  # type: ignore[arg-type]
    for rec in out:
        event = str(rec.get("event"))
        style = (
            "red"
            if event == "train_end" and rec.get("data", {}).get("status") == "failed"
            else None
        )
        table.add_row(
            str(rec.get("seq")),
            _fmt_ts(rec.get("ts")),
            str(rec.get("attempt", "")),
            str(rec.get("step", "")),
            str(rec.get("epoch", "")),
            event,
            summarize_data(event, rec.get("data") or {}),
            style=style,
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # pipes and files: do not wrap rows at 80 columns
    console.print(table)


# -- tail -----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("-f", "--follow", is_flag=True, help="Keep following until train_end.")
@click.option(
    "-n", "--lines", "n", type=int, default=10, show_default=True, help="Records to show first."
)
@click.option(
    "--interval",
    type=float,
    default=0.25,
    show_default=True,
    help="Seconds between checks while following.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSONL instead of a live view.")
@_user_errors
def tail(dir: str, follow: bool, n: int, interval: float, as_json: bool) -> None:
    """Show the newest records; with -f, a live view until the run ends.

    The live view shows a progress bar (step / planned steps), loss, lr, throughput and the
    last checkpoint, and ends after train_end. Interrupt with Ctrl-C at any time.
    """
    from journal.tail import follow_journal

    path = resolve_journal(dir, must_exist=not follow)
    try:
        code = follow_journal(path, follow=follow, first_n=n, interval=interval, as_json=as_json)
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)


# -- query ----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("--event", "-e", required=True, help="Event name, e.g. save.")
@click.option(
    "--last", "which", flag_value="last", default=True, help="The newest match (default)."
)
@click.option("--first", "which", flag_value="first", help="The oldest match.")
@click.option(
    "--field",
    "field_name",
    default=None,
    help="Dotted path to print, e.g. data.checkpoint_path (a bare name is looked up in the "
    "envelope, then in data). Default: the whole record as JSON.",
)
@_user_errors
def query(dir: str, event: str, which: str, field_name: str | None) -> None:
    """Print one value for scripts; exit 1 when there is no match.

    \b
    Example: the newest checkpoint path
      ilab-journal query runs/x --event save --field checkpoint_path
    """
    from journal.query import find_first, find_last, get_field, is_missing

    path = resolve_journal(dir)
    rec = find_last(path, event) if which == "last" else find_first(path, event)
    if rec is None:
        click.echo(f"no {event!r} record in {path}", err=True)
        sys.exit(1)
    value: Any = rec if field_name is None else get_field(rec, field_name)
    if is_missing(value):
        click.echo(f"{event!r} record seq {rec['seq']} has no field {field_name!r}", err=True)
        sys.exit(1)
    click.echo(value if isinstance(value, str) else _dumps(value))


# -- stats ----------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@_user_errors
def stats(dir: str, as_json: bool) -> None:
    """Counts per event, time per phase (step, evaluate, save) and throughput."""
    from journal.summary import JournalStats

    path = resolve_journal(dir)
    st = JournalStats()
    invalid = 0
    for records, bad in _scan(path):
        invalid += len(bad)
        for rec in records:
            st.add(rec)
    _require_journal(path, sum(st.counts.values()), invalid)
    d = st.to_dict()
    d["invalid_lines"] = invalid
    if as_json:
        click.echo(_dumps(d))
        return
    click.echo("events:")
    order = {e: i for i, e in enumerate(EVENTS)}
    for ev, c in sorted(d["counts"].items(), key=lambda kv: order.get(kv[0], 99)):
        click.echo(f"  {ev:<24}{c:>10}")
    click.echo("phases:            count     total s      mean s")
    for ph, v in d["phases"].items():
        click.echo(f"  {ph:<14}{v['count']:>9}{v['total_s']:>12.3f}{v['mean_s']:>12.4f}")
    click.echo(f"wall time: {d['wall_s']:.1f}s  invalid lines: {invalid}")
    if d["tokens_per_s"]:
        click.echo(
            f"throughput: {d['tokens_per_s']:.0f} tokens/s, {d['samples_per_s']:.1f} samples/s"
        )


# -- validate -------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
@_user_errors
def validate(dir: str, as_json: bool) -> None:
    """Check every record against the schema, seq order and line integrity.

    Exit 0 when the journal is sound, 1 when anything is corrupt (invalid lines, schema
    violations, seq not strictly increasing, unexplained seq gaps), 2 on usage errors.
    A torn final line (a writer may still be appending) is a warning only.
    """
    from pydantic import ValidationError

    from journal.schema import parse_record

    path = resolve_journal(dir)
    problems: list[str] = []
    warnings_: list[str] = []
    prev_seq: int | None = None
    explained: set[int] = set()
    gaps: list[tuple[int, int]] = []
    valid = 0
    reader = JournalReader(path)
    batch = reader.read(final=False)
    for line in batch.invalid:
        problems.append(f"line {line.line_no}: {line.reason}")
    if batch.torn_tail:
        warnings_.append(f"line {batch.line_no + 1}: torn final line (writer still appending?)")
    for i, rec in enumerate(batch.records):
        valid += 1
        try:
            parse_record(rec)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(x) for x in first["loc"])
            problems.append(f"seq {rec.get('seq')}: {rec.get('event')}: {loc}: {first['msg']}")
        seq = rec["seq"]
        if prev_seq is not None:
            if seq <= prev_seq:
                problems.append(f"seq {seq} after {prev_seq}: not strictly increasing")
            elif seq > prev_seq + 1:
                gaps.append((prev_seq + 1, seq - 1))
        if rec.get("event") == "journal_gap":
            d = rec.get("data") or {}
            if isinstance(d.get("first_seq"), int) and isinstance(d.get("last_seq"), int):
                explained.update(range(d["first_seq"], d["last_seq"] + 1))
        if isinstance(rec.get("v"), int) and rec["v"] > SCHEMA_VERSION and i == 0:
            warnings_.append(f"format version {rec['v']} is newer than {SCHEMA_VERSION}")
        prev_seq = seq if prev_seq is None else max(prev_seq, seq)
    for a, b in gaps:
        if not all(s in explained for s in range(a, b + 1)):
            problems.append(f"seq {a}..{b} missing with no journal_gap record")
    _require_journal(path, valid, len(batch.invalid))
    ok = not problems
    if as_json:
        click.echo(
            _dumps({"ok": ok, "records": valid, "problems": problems, "warnings": warnings_})
        )
    else:
        for w in warnings_:
            click.echo(f"warning: {w}", err=True)
        for p in problems[:50]:
            click.echo(f"error: {p}")
        if len(problems) > 50:
            click.echo(f"... and {len(problems) - 50} more")
        click.echo(
            f"{path}: {valid} records, {len(problems)} problems: {'OK' if ok else 'CORRUPT'}"
        )
    sys.exit(0 if ok else 1)


# -- schema ---------------------------------------------------------------------------------


@main.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of one journal record."""
    from journal.schema import json_schema

    click.echo(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode())


# -- control --------------------------------------------------------------------------------


@main.command()
@click.argument("command", type=click.Choice(CONTROL_COMMANDS))
@click.argument("dir", type=click.Path())
@click.option("--reason", default=None, help="Why; recorded in the journal's control record.")
@click.option("--source", default=None, help="Who asks (default: host:pid).")
@click.option("--id", "command_id", default=None, help="Command id (default: a fresh unique id).")
@_user_errors
def control(
    command: str, dir: str, reason: str | None, source: str | None, command_id: str | None
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
    """
    from journal.control import InvalidCommand, send_command

    p = Path(dir)
    if p.name == "journal.jsonl" and p.is_file():
        p = p.parent
    if not p.is_dir():
        raise UserError(f"{dir}: no such checkpoint directory")
    try:
        cid = send_command(p, command, reason=reason, source=source, command_id=command_id)
    except InvalidCommand as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        raise UserError(f"cannot write command in {p}: {exc.strerror or exc}") from None
    click.echo(cid)


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
@_user_errors
def plot(dir: str, output: str | None) -> None:
    """Plot loss, val_loss and learning rate per step to a PNG (needs the 'plot' extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UserError("plot needs matplotlib: pip install 'ilab-journal[plot]'") from None
    path = resolve_journal(dir)
    steps, losses, lrs, vsteps, vloss, saves = [], [], [], [], [], []
    for records, _ in _scan(path):
        for rec in records:
            d = rec.get("data") or {}
            if rec.get("event") == "log" and d.get("loss") is not None:
                steps.append(rec["step"])
                losses.append(d["loss"])
                lrs.append(d.get("lr"))
            elif rec.get("event") == "evaluate" and d.get("val_loss") is not None:
                vsteps.append(rec["step"])
                vloss.append(d["val_loss"])
            elif rec.get("event") == "save":
                saves.append(rec["step"])
    if not steps and not vsteps:
        raise UserError(f"{path}: no log or evaluate records to plot")
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    ax1.plot(steps, losses, label="loss")
    if vsteps:
        ax1.plot(vsteps, vloss, "o-", label="val_loss")
    for s in saves:
        ax1.axvline(s, color="grey", alpha=0.3, lw=0.8)
    ax1.set_ylabel("loss")
    ax1.legend()
    ax2.plot(steps, lrs, color="tab:green")
    ax2.set_ylabel("lr")
    ax2.set_xlabel("step")
    fig.tight_layout()
    out = Path(output) if output else path.parent / "journal.png"
    fig.savefig(out, dpi=100)
    click.echo(str(out))


if __name__ == "__main__":
    main()
