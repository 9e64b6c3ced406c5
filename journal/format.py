"""How records look to people: timestamps, numbers and one-line payload digests."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from journal.events import EVENTS
from journal.lock import describe

if TYPE_CHECKING:
    from journal.summary import RunSummary


def fmt_ts(ts: Any) -> str:
    """Local wall-clock time of a record, to the millisecond."""
    if not isinstance(ts, (int, float)):
        return "-"
    return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]


def fmt_num(v: Any) -> str:
    """Floats to 4 significant digits; everything else as ``str``."""
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def summarize_data(event: str, data: dict[str, Any], width: int = 90) -> str:
    """A one-line, human-readable digest of a payload."""
    keys: tuple[str, ...]
    if event == "report":
        return _report_digest(data, width)
    if event == "log":
        keys = ("loss", "lr", "grad_norm", "tokens_per_s", "elapsed_time")
    elif event == "train_begin":
        keys = ("world_size", "device_type", "total_steps", "resumed_from")
    else:
        keys = tuple(k for k, v in data.items() if not isinstance(v, (dict, list)) or k == "kind")
    parts = [f"{k}={fmt_num(data[k])}" for k in keys if k in data and data[k] is not None]
    text = " ".join(parts)
    return text if len(text) <= width else text[: width - 1] + "…"


def _report_digest(data: dict[str, Any], width: int) -> str:
    metrics = data.get("metrics") or {}
    where = Path(str(data.get("checkpoint_path") or "-")).name
    text = f"{where} " + " ".join(f"{k}={fmt_num(v)}" for k, v in metrics.items())
    return text if len(text) <= width else text[: width - 1] + "…"


def print_records_table(records: Iterable[dict[str, Any]]) -> None:
    """``ilab-journal show``: one row per record (rich; failed train_end in red)."""
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
        table.add_column(col, justify="right" if just == "right" else "left", no_wrap=col != "data")
    for rec in records:
        event = str(rec.get("event"))
        failed = event == "train_end" and (rec.get("data") or {}).get("status") == "failed"
        table.add_row(
            str(rec.get("seq")),
            fmt_ts(rec.get("ts")),
            str(rec.get("attempt", "")),
            str(rec.get("step", "")),
            str(rec.get("epoch", "")),
            event,
            summarize_data(event, rec.get("data") or {}),
            style="red" if failed else None,
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # pipes and files: do not wrap rows at 80 columns
    console.print(table)


def stats_text(d: dict[str, Any]) -> str:
    """``ilab-journal stats`` for people: counts per event, phases, throughput."""
    order = {e: i for i, e in enumerate(EVENTS)}
    lines = ["events:"]
    for ev, c in sorted(d["counts"].items(), key=lambda kv: order.get(kv[0], 99)):
        lines.append(f"  {ev:<24}{c:>10}")
    lines.append("phases:            count     total s      mean s")
    for ph, v in d["phases"].items():
        lines.append(f"  {ph:<14}{v['count']:>9}{v['total_s']:>12.3f}{v['mean_s']:>12.4f}")
    lines.append(f"wall time: {d['wall_s']:.1f}s  invalid lines: {d['invalid_lines']}")
    if d["tokens_per_s"]:
        lines.append(
            f"throughput: {d['tokens_per_s']:.0f} tokens/s, {d['samples_per_s']:.1f} samples/s"
        )
    return "\n".join(lines)


def status_text(s: RunSummary, path: Path) -> str:
    """``ilab-journal status`` for people: one aligned ``name  value`` row per fact."""
    progress = f"{s.last_step}" + (f"/{s.total_steps}" if s.total_steps else "")
    ago = f" ({time.time() - s.last_ts:.0f}s ago)" if s.last_ts else ""
    rows = [
        ("state", s.state + (f" ({s.reason})" if s.reason else "")),
        ("run", f"{s.run_id} attempt {s.attempt}"),
        ("step", f"{progress}  epoch {s.epoch}  samples {s.samples_seen}"),
        ("loss", fmt_num(s.last_loss) if s.last_loss is not None else "-"),
        ("val_loss", fmt_num(s.last_val_loss) if s.last_val_loss is not None else "-"),
        ("checkpoint", s.last_checkpoint or "-"),
        *_best_and_report_rows(s),
        ("last record", fmt_ts(s.last_ts) + ago),
        *([("held by", describe(s.holder))] if s.holder else []),
        ("journal", f"{path} ({s.records} records, {s.invalid_lines} invalid lines)"),
    ]
    if s.error:
        rows.insert(1, ("error", s.error))
    return "\n".join(f"{k:>12}  {v}" for k, v in rows)


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
