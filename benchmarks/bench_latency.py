"""Delivery latency: from the append of a record to the callback.

(a) A Python callable run by the watcher engine (what run_training embeds), waking on
    inotify (watchdog) and with ``--poll 0.1``.
(b) An external command (``date +%s%N``, which prints its own start time): from the append to
    the command's start, beside a bare ``subprocess`` spawn of the same command measured the
    same way in the same run.
"""

from __future__ import annotations

import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal import JournalWriter
from watcher import DeliveryResult, Hook, HookOptions, Watcher
from watcher.hooks.callbacks import CommandTarget


def _start(watcher: Watcher) -> threading.Thread:
    t = threading.Thread(target=watcher.run, daemon=True)
    t.start()
    return t


def _warm_up(writer: JournalWriter, delivered: threading.Event) -> None:
    """One unmeasured record, delivered end to end: the watcher (and its observer) is up."""
    delivered.clear()
    writer.append("log", {"warm_up": True})
    if not delivered.wait(10):
        raise RuntimeError("the watcher did not deliver the warm-up record")


def callable_latency(tmp: Path, n: int, poll: float | None) -> list[float]:
    ckpt = tmp / f"callable-{poll}"
    writer = JournalWriter(ckpt)
    appended: dict[int, int] = {}
    got: dict[int, int] = {}
    done = threading.Event()

    def on_log(event: Any, **data: Any) -> None:
        got[event.seq] = time.perf_counter_ns()
        done.set()

    w = Watcher(
        writer.path,
        [Hook("log", on_log, HookOptions(queue="all"))],
        poll=poll,
        persist_cursor=False,
    )
    th = _start(w)
    _warm_up(writer, done)
    for i in range(n):
        done.clear()
        t = time.perf_counter_ns()
        seq = writer.append("log", {"loss": 1.0, "i": i}, step=i)
        appended[seq] = t
        done.wait(5)
        # Random phase, so appends do not line up with the watcher's poll timer.
        time.sleep(random.uniform(0.001, poll or 0.005))
    writer.append("train_end", {"status": "completed"})
    th.join(10)
    writer.close()
    return [(got[s] - appended[s]) / 1e6 for s in appended if s in got]


def command_latency(tmp: Path, n: int) -> tuple[list[float], list[float]]:
    ckpt = tmp / "command"
    writer = JournalWriter(ckpt)
    appended: dict[int, int] = {}
    outs: dict[int, DeliveryResult] = {}
    done = threading.Event()

    def report(out: DeliveryResult) -> None:
        outs[out.seq] = out
        done.set()

    target = CommandTarget.parse("date +%s%N", "log")
    w = Watcher(
        writer.path,
        [Hook("log", target, HookOptions(queue="all"))],
        persist_cursor=False,
        reporter=report,
    )
    th = _start(w)
    _warm_up(writer, done)
    bare: list[float] = []
    for i in range(n):
        done.clear()
        t = time.time_ns()
        seq = writer.append("log", {"i": i}, step=i)
        appended[seq] = t
        done.wait(5)
        t = time.time_ns()  # the same command, spawned directly
        out = subprocess.run(["date", "+%s%N"], stdout=subprocess.PIPE, check=True).stdout
        bare.append((int(out) - t) / 1e6)
    writer.append("train_end", {"status": "completed"})
    th.join(10)
    writer.close()
    via = [(int(outs[s].stdout_tail or 0) - appended[s]) / 1e6 for s in appended if s in outs]
    return via, bare


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    n = 100 if args.quick else 400
    result: dict[str, Any] = {"samples": n}
    with tempfile.TemporaryDirectory(prefix="bench-latency-") as d:
        tmp = Path(d)
        inotify = callable_latency(tmp, n, None)
        polled = callable_latency(tmp, max(20, n // 5), 0.1)
        via, bare = command_latency(tmp, max(50, n // 2))
    result.update(
        {
            "callable_inotify_p50_ms": pct(inotify, 50),
            "callable_inotify_p99_ms": pct(inotify, 99),
            "callable_poll0.1_p50_ms": pct(polled, 50),
            "callable_poll0.1_p99_ms": pct(polled, 99),
            "command_start_p50_ms": pct(via, 50),
            "command_start_p99_ms": pct(via, 99),
            "bare_spawn_p50_ms": pct(bare, 50),
            "bare_spawn_p99_ms": pct(bare, 99),
            "command_minus_bare_p50_ms": pct(via, 50) - pct(bare, 50),
        }
    )
    emit("bench_latency", result, args.json)


if __name__ == "__main__":
    main()
