"""Post-hoc replay speed (issue 35): the watcher beside a plain loop over the same journal.

Each size N is a synthetic journal in a temp dir, written with ``JournalWriter``:
``train_begin``, N ``log`` records with a realistic payload (loss, lr, grad_norm,
tokens_per_s, batch metrics; ``tests.helpers.log_payload``), ``train_end``. On it, in one
run, side by side:

- ``plain-json`` / ``plain-orjson``: read the file line by line, ``json.loads`` (or
  ``orjson.loads``) each line and call ``on_<event>`` of a counting object. The floor.
- ``callable``: ``ilab-watch DIR --callback cb.py:Count --queue log=all --replay``, a real
  subprocess. ``Count.on_log`` only counts; ``on_train_end`` writes the count it saw to a
  file, so the ``seen@end`` column tells whether ``on_train_end`` came after every
  ``on_log`` (it should be N; issue 35 saw 1 of 2,000). ``late`` counts ``on_log`` calls
  that arrived after ``on_train_end``; ``peak`` is the watcher process's peak RSS then.
  A journal of 16 MiB or more gets a second process checking it ahead on a spare core
  (journal/read/precheck.py): ``peak`` is the watcher's own, the checker adds about 17 MB.
- ``in-process``: the same replay in this process (``Watcher(..., follow=False)`` with a
  state dir, the counting object's ``on_log(event, **payload)``): no interpreter start.
- ``tensorboard``: ``ilab-watch DIR --tensorboard LOGDIR --replay`` (skipped, with the reason,
  without the tensorboard package); then, untimed, TensorBoard's reader checks that every
  ``train/loss`` point is there once (``seen@end`` shows the points found; a miss fails it).
- ``mlflow``: ``ilab-watch DIR --mlflow sqlite:///FILE --replay`` into an MLflow sqlite store
  (skipped without mlflow).

How to read it. ``wall s`` is the whole subprocess (interpreter start and imports included,
which dominates the smallest sizes); ``deliv/s`` is N / wall (the ``log`` deliveries; for a
timed-out case, the K delivered / its wall); ``delivered`` counts the ``log`` deliveries
recorded ok (the watcher's results file; the plain loop's own count); ``x plain`` is wall /
the ``plain-json`` wall of the same size and round; ``% orjson`` is the speed as a
fraction of the ``plain-orjson`` loop's (``plain-orjson`` wall / wall; the goal of "One
truth of a run", point 10: the callable's replay at least 50 %; issue 35's goal: the callable at most 3x the plain
loop on 1M records, i.e. >= 100k deliveries/s on 2 cores). The second table is the
linearity measure: each case's wall at its largest completed size over its wall at the
smallest (issue 35: 1M/10k <= 120, the size ratio being 100). A case that runs past
``--case-timeout`` is killed (its process group, SIGKILL) and reported as "timed out after
T s (K of N delivered)", K counted from the ``log`` lines of the results file in its state
dir; nothing is extrapolated, and the case is not run at larger sizes.

``--rounds R`` runs every case R times per size, the order flipped each round (this
machine is shared: ratios are taken within a round), and prints the median and range of
the ``% orjson`` of ``callable`` and ``in-process``.

Usage: python benchmarks/bench_replay.py [--quick] [--sizes N ...] [--case-timeout S] [--payload small] [--rounds R]
(default sizes 10k, 100k, 1M; --quick: 2k and 10k). JSON: benchmarks/results/bench_replay.json.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit
from tests.helpers import COUNT_CALLBACK, write_log_journal

WATCH = Path(sys.executable).parent / "ilab-watch"
PLAIN = ("plain-json", "plain-orjson")
WATCHED = ("callable", "tensorboard", "mlflow")
IN_PROCESS = "in-process"  # the callable's replay without the interpreter's start


def small_payload(step: int, loss: float = 1.0) -> dict[str, Any]:
    """A ``log`` payload of loss, lr and grad_norm only (``--payload small``: 190-byte
    lines, for a plain loop as fast as the one issue 35 measured)."""
    return {"loss": loss, "lr": 1e-4, "grad_norm": 0.9}


def write_journal(ckpt: Path, n: int, payload: str = "realistic") -> float:
    """``train_begin``, ``n`` log records, ``train_end``; returns the seconds it took."""
    t0 = time.perf_counter()
    make = small_payload if payload == "small" else None
    write_log_journal(ckpt, n, run_id="bench", payload=make)
    return time.perf_counter() - t0


class PlainCount:
    """The plain loop's counting object: the same methods as cb.py's ``Count``."""

    def __init__(self) -> None:
        self.n = 0
        self.seen_at_end: int | None = None

    def on_log(self, record: dict[str, Any]) -> None:
        self.n += 1

    def on_train_end(self, record: dict[str, Any]) -> None:
        self.seen_at_end = self.n


def plain_loop(path: Path, loads: Callable[[bytes], Any]) -> dict[str, Any]:
    obj = PlainCount()
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        for line in f:
            rec = loads(line)
            method = getattr(obj, f"on_{rec['event']}", None)
            if method is not None:
                method(rec)
    wall = time.perf_counter() - t0
    return {"status": "ok", "wall_s": wall, "delivered": obj.n, "seen_at_end": obj.seen_at_end}


def in_process(ckpt: Path, work: Path) -> dict[str, Any]:
    """``Watcher(journal, hooks of a counting object, follow=False)`` in this process, with
    a state dir (cursor and results files, as ``ilab-watch --replay``): the replay minus
    the interpreter's start and imports, with this process's GC thresholds (``ilab-watch``
    raises them; an embedding program may not), so it can be the slower one."""
    from watcher.engine.engine import Watcher
    from watcher.hooks.hook import HookOptions, hooks_for_object

    work.mkdir(parents=True)
    obj = PlainCount()
    on_log, on_end = obj.on_log, obj.on_train_end

    class Count:  # the watcher's callable shape: (event, **payload)
        def on_log(self, event: Any, **data: Any) -> None:
            on_log(data)

        def on_train_end(self, event: Any, **data: Any) -> None:
            on_end(data)

    hooks = hooks_for_object(Count(), lambda ev: HookOptions(queue="all"))
    t0 = time.perf_counter()
    watcher = Watcher(ckpt / "journal.jsonl", hooks, follow=False, state_dir=work / "state")
    rc = watcher.run()
    wall = time.perf_counter() - t0
    status = "ok" if rc == 0 else "failed"
    row = {"status": status, "wall_s": wall, "delivered": obj.n, "seen_at_end": obj.seen_at_end}
    return row if rc == 0 else {**row, "note": f"run() returned {rc}"}


def delivered_logs(state_dir: Path) -> int:
    """``log`` deliveries recorded ok in the results files under ``state_dir`` (a line
    stands for ``count`` of them: a callable's plain successes in one batch share one)."""
    n = 0
    for path in state_dir.glob("*.results.jsonl"):
        with open(path, "rb") as f:
            for line in f:
                try:
                    r = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a line cut by the kill
                if r.get("event") == "log" and r.get("status") == "ok":
                    n += r.get("count", 1)
    return n


def watch_case(case: str, ckpt: Path, work: Path, n: int, timeout_s: float) -> dict[str, Any]:
    """One ``ilab-watch ... --replay`` subprocess; killed after ``timeout_s``."""
    work.mkdir(parents=True)
    state = work / "state"
    args = [str(WATCH), str(ckpt), "--replay", "-q", "--state-dir", str(state)]
    seen_file = work / "seen.json"
    if case == "callable":
        cb = work / "cb.py"
        cb.write_text(COUNT_CALLBACK.format(out=str(seen_file)))
        args += ["--callback", f"{cb}:Count", "--queue", "log=all"]
    elif case == "tensorboard":
        args += ["--tensorboard", str(work / "tb")]
    elif case == "mlflow":
        args += ["--mlflow", f"sqlite:///{work / 'mlflow.db'}"]
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env.setdefault("OMP_NUM_THREADS", "1")
    log_path = work / "watch.log"
    with open(log_path, "wb") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            args, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = None
        wall = time.perf_counter() - t0
    row: dict[str, Any] = {"wall_s": wall, "delivered": delivered_logs(state)}
    if seen_file.exists():
        seen = json.loads(seen_file.read_text())
        row.update(seen_at_end=seen["seen_at_end"], on_log=seen["on_log"], late=seen["late"])
        row["max_rss_mb"] = seen.get("max_rss_mb")
    if rc is None:
        k = row["delivered"]
        row["status"] = "timeout"
        row["note"] = f"timed out after {timeout_s:g} s ({k} of {n} delivered)"
    elif rc != 0:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        row["status"] = "failed"
        row["note"] = f"exit {rc}: {' | '.join(tail)}"
    else:
        row["status"] = "ok"
    if case == "tensorboard" and rc == 0:
        row.update(tensorboard_points(work / "tb", n))
    return row


def tensorboard_points(logdir: Path, n: int) -> dict[str, Any]:
    """Whether every ``train/loss`` point is in the event files once: steps 1..n (read
    back with TensorBoard's own reader, after the timed replay, from the run's own
    subdirectory of LOGDIR: ``<rundir>-<runid>``)."""
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    (run_dir,) = {p.parent for p in logdir.rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/loss")]
    once = sorted(steps) == list(range(1, n + 1))
    out: dict[str, Any] = {"points": len(steps), "every_point_once": once}
    if not once:
        out["status"] = "failed"
        out["note"] = (
            f"{len(steps)} train/loss points, {len(set(steps))} distinct steps, not 1..{n}"
        )
    return out


def missing(case: str) -> str | None:
    """Why ``case`` cannot run here, or None."""
    if case in ("tensorboard", "mlflow") and importlib.util.find_spec(case) is None:
        return f"the {case} package is not installed"
    if case in WATCHED and not WATCH.exists():
        return f"{WATCH} not found"
    return None


def fmt_row(r: dict[str, Any]) -> str:
    if r["status"] == "skipped":
        return f"{r['case']:<13} {r['n']:>9,}  skipped: {r['note']}"
    rate = r["n"] / r["wall_s"] if r["status"] == "ok" else r["delivered"] / r["wall_s"]
    ratio = r.get("x_plain")
    speed = r.get("orjson_speed")
    seen = r.get("seen_at_end", r.get("points"))
    seen_s = "-" if seen is None else f"{seen:,}/{r['n']:,}"
    if r.get("late"):
        seen_s += f" ({r['late']:,} late)"
    line = (
        f"{r['case']:<13} {r['n']:>9,} {r['wall_s']:>9.2f} {rate:>12,.0f} "
        f"{'-' if ratio is None else f'{ratio:,.1f}':>9} "
        f"{'-' if speed is None else f'{speed:.0%}':>9} {r['delivered']:>10,} {seen_s:>20}"
    )
    if r.get("max_rss_mb"):
        line += f"  peak {r['max_rss_mb']:,.0f} MB"
    return line + ("" if r["status"] == "ok" else f"  {r['note']}")


def run_case(
    case: str,
    n: int,
    ckpt: Path,
    work: Path,
    mb: float,
    gave_up: dict[str, str],
    args: Any,
) -> dict[str, Any]:
    """One case on the journal of size ``n``: its row (skipped, with why, when it cannot
    run here or timed out at a smaller size)."""
    why = gave_up.get(case) or missing(case)
    if why:
        return {"case": case, "n": n, "status": "skipped", "note": why}
    if case in PLAIN:
        loads = json.loads if case == "plain-json" else orjson.loads
        row = plain_loop(ckpt / "journal.jsonl", loads)
    elif case == IN_PROCESS:
        row = in_process(ckpt, work)
    else:
        row = watch_case(case, ckpt, work, n, args.case_timeout)
    row = {"case": case, "n": n, "journal_mb": mb, **row}
    if row["status"] == "ok":
        row["deliveries_per_s"] = n / row["wall_s"]
    elif row["status"] == "timeout":
        gave_up[case] = f"timed out at N={n:,}"
    return row


def replay_speeds(rows: list[dict[str, Any]], case: str) -> dict[int, list[float]]:
    """Per size, ``case``'s speed as a fraction of the plain ``orjson.loads`` loop's, one
    per round (the goal: the callable's at least 50 %)."""
    out: dict[int, list[float]] = {}
    for r in rows:
        if r["case"] == case and "orjson_speed" in r:
            out.setdefault(r["n"], []).append(r["orjson_speed"])
    return out


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="log records per journal")
    ap.add_argument("--case-timeout", type=float, default=300.0, help="seconds per watcher run")
    ap.add_argument(
        "--cases", nargs="+", default=[*PLAIN, IN_PROCESS, *WATCHED], help="cases to run"
    )
    ap.add_argument(
        "--rounds", type=int, default=1, help="runs of every case per size, the order flipped"
    )
    ap.add_argument(
        "--payload",
        choices=["realistic", "small"],
        default="realistic",
        help="log payload: realistic (510-byte lines) or small (loss, lr, grad_norm)",
    )
    args = ap.parse_args()
    sizes = sorted(args.sizes or ([2_000, 10_000] if args.quick else [10_000, 100_000, 1_000_000]))
    rows: list[dict[str, Any]] = []
    gave_up: dict[str, str] = {}  # case -> why it is not run at larger sizes
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="bench-replay-") as d:
            tmp = Path(d)
            ckpt = tmp / "ckpt"
            write_s = write_journal(ckpt, n, args.payload)
            journal_path = ckpt / "journal.jsonl"
            mb = journal_path.stat().st_size / 1e6
            print(f"-- N={n:,}: journal {mb:.1f} MB written in {write_s:.1f} s", flush=True)
            for rnd in range(args.rounds):
                # this machine is shared: the ratios are taken within a round, whose order
                # flips (the plain loops first, then last)
                order = args.cases if rnd % 2 == 0 else list(reversed(args.cases))
                this_round: dict[str, dict[str, Any]] = {}
                for case in order:
                    row = run_case(case, n, ckpt, tmp / f"{case}-{rnd}", mb, gave_up, args)
                    row["round"] = rnd
                    this_round[case] = row
                    rows.append(row)
                for case in args.cases:  # the ratios once the round's plain loops are done
                    row = this_round[case]
                    for plain, key, ratio in (
                        ("plain-json", "x_plain", lambda r, p: r / p),
                        ("plain-orjson", "orjson_speed", lambda r, p: p / r),
                    ):
                        base = this_round.get(plain)
                        if row["status"] == "ok" and base and base["status"] == "ok":
                            row[key] = ratio(row["wall_s"], base["wall_s"])
                    print("   " + fmt_row(row), flush=True)
    linearity: dict[str, dict[str, Any]] = {}
    for case in args.cases:
        done = [r for r in rows if r["case"] == case and r["status"] == "ok" and r["round"] == 0]
        if len(done) >= 2:
            lo, hi = done[0], done[-1]
            linearity[case] = {
                "smallest": lo["n"],
                "largest": hi["n"],
                "size_ratio": hi["n"] / lo["n"],
                "time_ratio": hi["wall_s"] / lo["wall_s"],
            }
    if not args.json:
        print(f"== bench_replay (case timeout {args.case_timeout:g} s)")
        head = f"{'case':<13} {'N':>9} {'wall s':>9} {'deliv/s':>12} {'x plain':>9} {'% orjson':>9}"
        print(head + f" {'delivered':>10} {'seen@end/N':>20}")
        for r in rows:
            print(fmt_row(r))
        print("linearity: wall at the largest completed size / wall at the smallest")
        for case, lin in linearity.items():
            print(
                f"  {case:<13} {lin['largest']:>9,} / {lin['smallest']:<9,} "
                f"size x{lin['size_ratio']:,.0f}  time x{lin['time_ratio']:,.1f}"
            )
        for case in ("callable", IN_PROCESS):
            for n, speeds in replay_speeds(rows, case).items():
                print(
                    f"{case} replay, N={n:,}: {statistics.median(speeds):.0%} of a plain "
                    f"orjson.loads loop's speed (median of {len(speeds)}, range "
                    f"{min(speeds):.0%}-{max(speeds):.0%}; goal >= 50 %)"
                )
        sys.stdout.flush()
    result = {
        "payload": args.payload,
        "sizes": sizes,
        "case_timeout_s": args.case_timeout,
        "rows": rows,
        "linearity": linearity,
    }
    emit("bench_replay", result, args.json)


if __name__ == "__main__":
    main()
