"""How records look to people: timestamps, numbers and one-line payload digests.

Text from records (and lock files) is data, never instructions to the terminal: control
characters and bidi marks are shown as escapes (:func:`journal.record.text.printable`, the one
every console uses) and rich never reads it as markup (it gets :class:`rich.text.Text`, not a
markup string).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from journal.record.events import EVENTS
from journal.record.record import Record
from journal.record.text import printable
from journal.rundir.ledger import GUARD_STALE_S
from journal.rundir.lock import describe

if TYPE_CHECKING:
    from journal.views.summary import RunSummary


def fmt_ts(ts: Any) -> str:
    """Local wall-clock time of a record, to the millisecond."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return "-"
    try:
        return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, ValueError, OSError):  # a number, but no date
        return fmt_num(ts)


def fmt_num(v: Any) -> str:
    """Floats to 4 significant digits; everything else as ``str``."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


#: The payload fields a digest shows, in order, by event (others: every scalar field).
_DIGEST_KEYS = {
    "log": ("loss", "lr", "grad_norm", "tokens_per_s", "elapsed_time"),
    "train_begin": ("world_size", "device_type", "total_steps", "resumed_from"),
    # the verdict before the (long) source: a refusal must show
    "control": ("command", "id", "accepted", "applied_at_step", "reason", "source"),
    # what went wrong before its (long) id (docs/alerts.md)
    "alert": ("kind", "step", "attempt", "message", "evidence", "id"),
    "alert_told": ("id", "told", "failed"),
}


def summarize_data(event: str, data: dict[str, Any], width: int = 90) -> str:
    """A one-line, human-readable digest of a payload."""
    if event == "report":
        return _report_digest(data, width)
    if event == "job":  # which job evaluated which checkpoint (journal/channels/jobs.py)
        where = Path(str(data.get("checkpoint_path") or "-")).name
        said = ("state", "node", "exit_code", "attempt")
        parts = [f"{k}={data[k]}" for k in said if data.get(k) is not None]
        text = f"{data.get('scheduler')} job {data.get('job_id')} {where} " + " ".join(parts)
        return _cut(text, width)
    keys = _DIGEST_KEYS.get(event) or tuple(
        k for k, v in data.items() if not isinstance(v, (dict, list)) or k == "kind"
    )
    parts = [f"{k}={fmt_num(data[k])}" for k in keys if k in data and data[k] is not None]
    return _cut(" ".join(parts), width)


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, an ellipsis saying where it was cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


#: Lines of a traceback that say nothing of what went wrong (the exception lines do).
_TRACEBACK_NOISE = ("Traceback (most recent call last)", "During handling of", "The above exc")


def error_line(text: str, width: int = 200) -> str:
    """A multi-line error (an exception whose message holds tracebacks, such as torch's
    CheckpointException after a full disk) as one line: its exception lines, each once,
    without the frames. The whole text stays in the record (``show --json``)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    said = [
        ln
        for ln in lines
        if not ln[0].isspace() and not ln.startswith(_TRACEBACK_NOISE)  # frames are indented
    ]
    return _cut("; ".join(dict.fromkeys(said or lines[:1])), width)


def _report_digest(data: dict[str, Any], width: int) -> str:
    metrics = data.get("metrics") or {}
    where = Path(str(data.get("checkpoint_path") or "-")).name
    return _cut(f"{where} " + " ".join(f"{k}={fmt_num(v)}" for k, v in metrics.items()), width)


def print_records_table(records: Iterable[Record]) -> None:
    """``ilab-journal show``: one row per record (rich; failed train_end in red)."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=None, pad_edge=False, header_style="bold")
    for col in ("seq", "time", "att", "step", "ep", "event", "data"):
        left = col in ("time", "event", "data")
        table.add_column(col, justify="left" if left else "right", no_wrap=col != "data")
    for rec in records:
        event, data = rec["event"], rec["data"]
        failed = event == "train_end" and data.get("status") == "failed"
        cells = (
            str(rec["seq"]),
            fmt_ts(rec["ts"]),
            str(rec["attempt"]),
            str(rec["step"]),
            str(rec["epoch"]),
            event,
            summarize_data(event, data),
        )
        table.add_row(*(Text(printable(c)) for c in cells), style="red" if failed else None)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # pipes and files: do not wrap rows at 80 columns
    console.print(table)


def stats_text(d: dict[str, Any]) -> str:
    """``ilab-journal stats`` for people: counts per event, phases, throughput."""
    order = {e: i for i, e in enumerate(EVENTS)}
    lines = ["events:"]
    for ev, c in sorted(d["counts"].items(), key=lambda kv: order.get(kv[0], 99)):
        lines.append(f"  {printable(ev):<24}{c:>10}")
    # A phase with no measured record has no time ("n/a", not 0); records that carry no
    # duration (the bridges' saves) get a column of their own, only when there are some.
    unmeasured = any(v.get("unmeasured") for v in d["phases"].values())
    lines.append(
        "phases:            count     total s      mean s"
        + ("   no duration" if unmeasured else "")
    )
    for ph, v in d["phases"].items():
        total = "n/a" if v["total_s"] is None else f"{v['total_s']:.3f}"
        mean = "n/a" if v["mean_s"] is None else f"{v['mean_s']:.4f}"
        row = f"  {ph:<14}{v['count']:>9}{total:>12}{mean:>12}"
        lines.append(row + (f"{v.get('unmeasured', 0):>14}" if unmeasured else ""))
    lines.append(f"wall time: {d['wall_s']:.1f}s  invalid lines: {d['invalid_lines']}")
    if d["tokens_per_s"]:
        lines.append(
            f"throughput: {d['tokens_per_s']:.0f} tokens/s, {d['samples_per_s']:.1f} samples/s"
        )
    return "\n".join(lines)


def status_text(s: RunSummary, path: Path) -> str:
    """``ilab-journal status`` for people: one aligned ``name  value`` row per fact."""
    rows = [("state", s.state + (f" ({s.reason})" if s.reason else ""))]
    if s.stop_source:  # who ended it: a gate tells an eval's stop from an operator's
        rows.append(("stopped by", s.stop_source + (f" ({s.stopped_by})" if s.stopped_by else "")))
    if s.run_id is not None or s.records:  # nothing to say about a run without records
        progress = f"{s.last_step}" + (f"/{s.total_steps}" if s.total_steps else "")
        ago = f" ({time.time() - s.last_ts:.0f}s ago)" if s.last_ts else ""
        rows += [
            *([("error", _error_row(s.error, path))] if s.error else []),
            ("run", f"{s.run_id} attempt {s.attempt}"),
            ("step", f"{progress}  epoch {s.epoch}  samples {s.samples_seen}"),
            ("loss", fmt_num(s.last_loss) if s.last_loss is not None else "-"),
            ("val_loss", fmt_num(s.last_val_loss) if s.last_val_loss is not None else "-"),
            ("checkpoint", s.last_checkpoint or "-"),
            *_best_and_report_rows(s),
            ("last record", fmt_ts(s.last_ts) + ago),
        ]
    if s.alerts and s.last_alert:  # what went wrong, said by a watcher (docs/alerts.md)
        rows.append(("alerts", _alert_row(s.alerts, s.last_alert, path)))
    if s.guards:  # who watches the run for hangs and deaths, and when each last looked
        rows.append(("guards", "; ".join(map(_guard_text, s.guards))))
    if s.unapplied_commands:  # sent too late: the run had ended (journal.channels.control)
        n = s.unapplied_commands
        rows.append(("control", f"{n} control command(s) arrived after the run ended: not applied"))
    if s.refused_reports:  # their metrics are not in the journal: never count for keep_best
        n = s.refused_reports
        why = f"ilab-journal show {path.parent} -e control"
        rows.append(("reports", f"{n} report(s) refused when journaled (why: {why})"))
    if s.prunable_checkpoints:  # kept by leases whose holders died: nothing rotates now
        n, why = len(s.prunable_checkpoints), ""
        if s.expired_leases:
            why = f"; {s.expired_leases} expired lease(s) on them hold nothing"
        rows.append(
            (
                "retention",
                f"{n} checkpoint(s) beyond keep_last_n={s.keep_last_n} that no lease holds"
                f"{why}; ilab-journal prune {path.parent} removes them",
            )
        )
    if s.holder and s.state != "starting":  # "starting" names the holder already
        rows.append(("held by", holder_text(s.holder)))
    if path.exists():
        rows.append(("journal", f"{path} ({s.records} records, {s.invalid_lines} invalid lines)"))
    else:
        rows.append(("journal", f"{path} (not created yet)"))
    return "\n".join(f"{k:>12}  {printable(str(v))}" for k, v in rows)


def _error_row(error: str, path: Path) -> str:
    """The error in one line, and where its whole text is when that line is not all."""
    line = error_line(error)
    if line == error:
        return line
    return f"{line}  (whole text: ilab-journal show {path} -e train_end --json)"


def _alert_row(count: int, a: dict[str, Any], path: Path) -> str:
    """``2, latest: failed at step 5 (12:01:03): <what was seen>; told json://host:80``."""
    step = f" at step {a['step']}" if a.get("step") is not None else ""
    text = f"{count}, latest: {a.get('kind')}{step} ({fmt_ts(a.get('ts'))}): "
    text += error_line(str(a.get("message") or ""), 120)
    if evidence := [str(e) for e in a.get("evidence") or []]:  # a failure's log, a hang's dir
        text += f"; evidence: {path.parent / (evidence[0] if len(evidence) == 1 else Path(evidence[0]).parent)}"
    targets, told = a.get("targets") or [], a.get("told")
    if told:
        text += f"; told {', '.join(told)}"
    failed = [str(f.get("target")) for f in a.get("failed") or []]
    if failed:
        text += f"; not told {', '.join(failed)}"
    if targets and told is None:
        text += f"; telling {', '.join(targets)}"
    if a.get("recovered_at"):
        text += f"; recovered {fmt_ts(a['recovered_at'])}"
    if a.get("journaled") is False:  # its claim in the ledger: the journal's writer is stuck
        text += "; not in the journal yet"
    if count > 1:
        text += f"  (all: ilab-journal show {path.parent} -e alert)"
    return text


def _guard_text(g: dict[str, Any]) -> str:
    """``ilab-watch on host-a (pid 4242; hangs, deaths): looked 2s ago``; a heartbeat
    that aged says the guard stopped looking."""
    ago = time.time() - (g.get("looked_at") or 0.0)
    text = f"{g.get('source')} on {g.get('host')} (pid {g.get('pid')}; {g.get('watches')}): "
    if ago >= GUARD_STALE_S:
        return text + f"last looked {fmt_ts(g.get('looked_at'))}, {ago:.0f}s ago: gone?"
    return text + f"looked {max(ago, 0):.0f}s ago"


def holder_text(info: dict[str, Any]) -> str:
    """Who holds a lock, from its file: ``launcher pid 4242 on host-a since 09:12:03``
    (whatever the file holds, one line)."""
    try:
        return describe(info)
    except (TypeError, ValueError, OverflowError, OSError):  # a lock file we did not write
        return f"pid {info.get('pid', '?')}"


def _best_and_report_rows(s: RunSummary) -> list[tuple[str, str]]:
    rows = []
    if s.keep_best:
        b = s.best_checkpoint
        value = f"{b['checkpoint_path']} ({b['metric']} {fmt_num(b['value'])})" if b else "-"
        rows.append(("best", f"{value}  [keep_best {s.keep_best}]"))
    if s.last_report:
        digest = _report_digest(s.last_report, 80)
        rows.append(("last report", f"{digest}  ({s.reports} reports)"))
    return rows
