"""What ``/api/`` answers for one run: its summary, curves (downsampled for the first paint,
full resolution on zoom), markers, checkpoints, and what changed since the page last asked.
Every value is JSON; strings from records stay strings (the page shows them as text).

One answer's size is bounded whatever the journal: at most ``2 * width`` points per curve
(an update from far behind sends the downsampled curve, as the first paint does), the
fold's curves (:data:`journal.serve.fold.MAX_CURVES`), :data:`MAX_MARKERS` new markers per
update, and the names listed beyond the curves."""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from journal.checkpoints.leases import Lease, active
from journal.serve.fold import RunFold, Series, scalar
from journal.views.fold import AlertSeen
from journal.views.summary import STATE_EXIT_CODES, RunSummary

#: What each state's exit code of ``ilab-journal status`` means, shown next to the state.
STATE_MEANING: dict[str, str] = {
    "completed": "exit 0: completed",
    "failed": "exit 1: failed",
    "running": "exit 3: running",
    "starting": "exit 3: starting",
    "stopped": "exit 4: stopped by a command or a signal",
    "interrupted": "exit 5: interrupted",
    "stale": "exit 6: stale (no record, no train_end)",
    "empty": "exit 7: no record yet",
    "hung": "exit 8: running, but hung (a hang alert and no step since)",
    "error": "the journal cannot be read: see the reason",
}
#: Points per curve on the first paint (two per pixel bucket: its min and its max).
DEFAULT_WIDTH = 1000
#: New markers one update carries at most: a page far behind gets the rest on its next asks.
MAX_MARKERS = 5000


def downsample(
    steps: array[float], values: array[float], lo: float | None, hi: float | None, width: int
) -> tuple[list[float], list[float]]:
    """The points in ``[lo, hi]``, at most ``2 * width``: each of ``width`` equal step buckets
    keeps its min and its max in step order (peaks survive, unlike a plain stride)."""
    x = np.frombuffer(steps, dtype=np.float64) if len(steps) else np.empty(0)
    y = np.frombuffer(values, dtype=np.float64) if len(values) else np.empty(0)
    start = 0 if lo is None else int(np.searchsorted(x, lo, side="left"))
    end = len(x) if hi is None else int(np.searchsorted(x, hi, side="right"))
    x, y = x[start:end], y[start:end]
    if len(x) <= 2 * width:
        return x.tolist(), y.tolist()
    span = x[-1] - x[0] or 1.0
    bucket = np.minimum(((x - x[0]) / span * width).astype(np.int64), width - 1)
    edges = np.flatnonzero(np.diff(bucket)) + 1
    starts, parts = np.concatenate(([0], edges)), np.split(y, edges)
    lows = starts + np.array([np.argmin(part) for part in parts])
    highs = starts + np.array([np.argmax(part) for part in parts])
    keep = np.unique(np.concatenate((lows, highs)))  # sorted: step order
    return x[keep].tolist(), y[keep].tolist()


def run_row(s: RunSummary, alerts: list[AlertSeen], log: Mapping[str, Any]) -> dict[str, Any]:
    """What a run's page and its row in the runs list both say of it (``log``: the payload
    of its last ``log`` record), with its marks: its alerts' kinds (hang, diverged, ...;
    raised and not journaled yet too: :meth:`~journal.views.fold.RunFold.judged`'s), the
    newest, and ``stuck``: the run is hung, or that one is a death that no step has ended
    since (no ETA)."""
    last = s.last_alert
    died = last is not None and last["kind"] == "died" and (last["step"] or 0) >= s.last_step
    return {
        "run_id": s.run_id,
        "attempt": s.attempt,
        "state": s.state,
        "reason": s.reason,
        "step": s.last_step,
        "total_steps": s.total_steps,
        "tokens_per_s": log.get("tokens_per_s"),
        "best": s.best_checkpoint,
        "last_loss": s.last_loss,
        "last_ts": s.last_ts,
        "alert_kinds": sorted({a.kind for a in alerts} - {"recovered"}),
        "stuck": s.state == "hung" or died,
        "last_alert": last,
    }


def summary(fold: RunFold, *, stale_after: float, now: float | None = None) -> dict[str, Any]:
    """The run's state in ``status``'s words, with progress, throughput, ETA (none for a
    run stale or stuck), best and alerts."""
    now = time.time() if now is None else now
    s, alerts = fold.run.judged(stale_after=stale_after, now=now)
    prev, last = fold.prev_log, fold.last_log
    log = last["data"] if last is not None else {}
    row = run_row(s, alerts, log)
    eta = None
    # (a log record's ts is None when its writer left it out: no rate from it)
    if s.state == "running" and not row["stuck"] and prev and last and s.total_steps:
        steps, t1, t0 = last["step"] - prev["step"], last["ts"], prev["ts"]
        if steps > 0 and t1 is not None and t0 is not None and t1 > t0:
            eta = (s.total_steps - s.last_step) * (t1 - t0) / steps
    return {
        **row,
        "meaning": STATE_MEANING.get(s.state, ""),
        "exit_code": STATE_EXIT_CODES.get(s.state, 1),
        "samples_per_s": log.get("samples_per_s"),
        "eta_s": eta,
        "keep_best": s.keep_best,
        "last_val_loss": s.last_val_loss,
        "age_s": None if s.last_ts is None else max(0.0, now - s.last_ts),
        "stale": s.state == "stale",
        # the run's last attempt has journaled its end: a command would never be applied
        "ended": fold.run.ended,
        "records": fold.count,
        "invalid_lines": fold.invalid,
        "error": s.error,
        "guards": [{**g, "age_s": now - g["looked_at"]} for g in s.guards],
    }


def leases_held(fold: RunFold) -> tuple[list[Lease], str]:
    """The leases held on the run's checkpoints now, and their signature: what the page
    holds is stale when it differs (a lease released or expired, taken or renewed changes
    no record, only ``leases/``)."""
    run_dir = fold.run.run_dir
    held = active(run_dir) if run_dir is not None else []
    sig = hashlib.blake2s(
        orjson.dumps([[x.id, x.checkpoint, x.expires] for x in held]), digest_size=8
    ).hexdigest()
    return held, sig


def checkpoints(fold: RunFold, held: list[Lease] | None = None) -> list[dict[str, Any]]:
    """The checkpoints table: the run's one fold (:meth:`journal.views.fold.RunFold.checkpoints`)
    with what the disk says now: every checkpoint once, whatever spelling journaled it, its
    state (on_disk, leased, removed, missing), the removal (when, why, by whom), the
    leases held now (``held``: read now when not given), reports, jobs and which is the
    best. Strings clipped for the page."""
    if held is None:
        held = leases_held(fold)[0]
    return [_clipped(view.to_dict()) for view in fold.run.checkpoints(leases=held)]


def _clipped(v: Any) -> Any:
    """A row as JSON scalars where the page shows text (a record's strings may be long)."""
    if isinstance(v, dict):
        return {str(k): _clipped(x) for k, x in v.items()}
    return [_clipped(x) for x in v] if isinstance(v, list) else scalar(v)


def _series_out(series: Series, lo: float | None, hi: float | None, width: int) -> dict:
    xs, ys = downsample(series.steps, series.values, lo, hi, width)
    return {"name": series.name, "x": xs, "y": ys, "n": len(series.steps)}


def snapshot(fold: RunFold, *, width: int, stale_after: float) -> dict[str, Any]:
    """The first paint: every curve downsampled to ``width`` buckets, every marker."""
    held, sig = leases_held(fold)
    with fold.lock:
        return {
            "summary": summary(fold, stale_after=stale_after),
            "count": fold.count,
            "series": [_series_out(s, None, None, width) for s in fold.series.values()],
            "markers": fold.markers,
            "checkpoints": checkpoints(fold, held),
            "leases": sig,
            "listed": list(fold.listed),
            "listed_all": fold.listed_all,
        }


def series_range(
    fold: RunFold, name: str, lo: float | None, hi: float | None, width: int
) -> dict[str, Any] | None:
    """One curve between two steps (zoom): full resolution when it fits ``2 * width``; a
    listed name's read from the journal now (:meth:`RunFold.listed_curve`)."""
    with fold.lock:
        series = fold.series.get(name)
        if series is not None:
            return _series_out(series, lo, hi, width)
    series = fold.listed_curve(name)  # outside the lock: the page's polls go on meanwhile
    return None if series is None else _series_out(series, lo, hi, width)


def updates(
    fold: RunFold,
    *,
    since: int,
    lengths: list[int],
    markers: int,
    width: int,
    stale_after: float,
    leases: str | None = None,
) -> dict[str, Any]:
    """What changed after the page's ``since`` records: per curve (in the snapshot's order,
    ``lengths`` the points the page has) the new points, or the whole curve again,
    downsampled (``reset``), when it changed other than by appending or when the new points
    are more than ``2 * width`` (a page far behind, ``since=0``); at most
    :data:`MAX_MARKERS` new markers; the summary, the table and the listed names when
    they changed. The table is sent again too when the leases held now differ from those
    the page was sent (``leases``: their signature, as the last answer gave it; None:
    not compared)."""
    held, sig = leases_held(fold)
    with fold.lock:
        out_series = []
        for i, series in enumerate(fold.series.values()):
            have = lengths[i] if i < len(lengths) else 0
            n = len(series.steps)
            if series.reset_at > since or have > n or n - have > 2 * width:
                out_series.append({**_series_out(series, None, None, width), "reset": True})
            elif have < n:
                xs, ys = series.steps[have:].tolist(), series.values[have:].tolist()
                out_series.append({"name": series.name, "x": xs, "y": ys, "n": n})
        return {
            "summary": summary(fold, stale_after=stale_after),
            "count": fold.count,
            "series": out_series,
            "markers": fold.markers[markers : markers + MAX_MARKERS],
            "checkpoints": (
                checkpoints(fold, held)
                if fold.ck_changed_at > since or leases not in (None, sig)
                else None
            ),
            "leases": sig,
            "listed": list(fold.listed) if fold.names_changed_at > since else None,
            "listed_all": fold.listed_all,
            # alert markers the page has whose outcome (who was told) came since
            "told": [fold.markers[i] for i, at in fold.told.items() if since < at and i < markers],
        }
