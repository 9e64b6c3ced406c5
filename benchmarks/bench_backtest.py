"""``ilab-journal backtest`` and ``check --wait`` speed (issue 46), side by side in one run.

N journals (default 100) of about 10k records each, like a real run's at ``journal_detail
step``: per step ``step_begin``, ``log`` (the trainer's payload) and ``step_end``; every 20
steps an ``evaluate`` (a noisy falling val_loss, different per journal), every 40 a ``save``
and its ``report`` (accuracy). Four distinct journals are written with ``JournalWriter`` and
copied to make N files. Timed on the same files, in one process:

- ``plain json.loads``: every line of every file read and ``json.loads``-ed, nothing else:
  the floor the issue measures against;
- ``backtest in-process``: ``watcher.backtest.replay.replay`` of every journal with the
  8-value sweep ``--early-stopping metric=val_loss,patience=1..8`` and the run's own
  retention (each journal read once; the 8 EarlyStopping callbacks run by the watcher's
  executor);
- ``backtest CLI``: ``ilab-journal backtest <N journals> --early-stopping
  metric=val_loss,patience=1..8 --json`` as a subprocess (interpreter start included).

The issue's bound: backtest at most 3x the plain pass. Then its memory: the peak RSS of
``ilab-journal backtest`` (a subprocess: ``getrusage`` of its children, read by a wrapper
process) on one journal of ``--memory-lines`` records (1M: about 260 MB; the same records
written straight with orjson, in seconds) with the same sweep and ``--divergence
metric=loss`` (a logged metric judged too), against the same on a 1k-record journal (the
interpreter and the imports): the bound (Hardening 4) is 300 MB; and ``--hang-after auto``
on ``--memory-lines`` records with an eval (a declared phase) at every step (Hardening 5:
1.58 GB before). Then ``check --wait`` on a finished
run with nothing pending (one of the journals: it ended long ago, no job, no lease), a
subprocess, with the gate's facts (the summary: from the journal index, as ``status``) and
with ``best(accuracy)`` (the index, then the lines holding it), against ``ilab-journal status`` on the same run
and against the interpreter start and ``ilab-journal``'s imports alone (``python -c "import
journal.cli.main"``, which every command pays): the issue's bound is 0.5 s.
Each time is the median of ``--repeat`` runs.

Usage: python benchmarks/bench_backtest.py [--quick] [--journals N] [--repeat R]
[--memory-lines N] [--memory-only]
JSON: benchmarks/results/bench_backtest.json (``--memory-only``: bench_backtest_memory.json).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import orjson

from benchmarks.common import bench_parser, emit
from journal import JournalWriter
from tests.helpers import begin_payload, log_payload

BIN = Path(sys.executable).parent
SWEEP = "metric=val_loss,patience=1..8"


class FastWriter:
    """``JournalWriter``'s records (the same envelope) written straight with orjson: no
    fsync, lock or index, for a journal of a million records in seconds."""

    def __init__(self, run: Path, run_id: str) -> None:
        run.mkdir(parents=True, exist_ok=True)
        self.f = open(run / "journal.jsonl", "wb")  # noqa: SIM115 (closed by __exit__)
        self.run_id, self.seq = run_id, 0

    def append(
        self, event: str, data: dict[str, Any] | None = None, *, step: int = 0,
        samples_seen: int = 0, ts: float,
    ) -> None:  # fmt: skip
        rec = {"v": 1, "seq": self.seq, "run_id": self.run_id, "attempt": 1, "ts": ts,
               "event": event, "step": step, "epoch": 0, "samples_seen": samples_seen,
               "data": data or {}}  # fmt: skip
        self.f.write(orjson.dumps(rec) + b"\n")
        self.seq += 1

    def __enter__(self) -> FastWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def write_journal(
    run: Path, seed: int, steps: int, *, fast: bool = False, eval_every: int = 20
) -> None:
    """A step-detail run of about ``3 * steps`` records, ended long ago (``fast``: written
    by :class:`FastWriter`); an eval every ``eval_every`` steps."""
    rng = random.Random(seed)
    t = time.time() - 86400.0
    begin = begin_payload(steps, world_size=2, hostname="bench")
    begin["config"] = {**begin.get("config", {}), "keep_best": "accuracy:max", "keep_last_n": 2}
    writer = FastWriter if fast else JournalWriter
    with writer(run, run_id=f"bench{seed}") as w:
        w.append("train_begin", begin, ts=t)
        val, acc = 2.0, 0.0
        for s in range(1, steps + 1):
            t += 0.5
            w.append("step_begin", step=s, ts=t)
            w.append("log", log_payload(s), step=s, samples_seen=8 * s, ts=t)
            if s % eval_every == 0:
                val = max(0.05, val * rng.uniform(0.9, 1.04))
                ev = {"val_loss": val, "val_num_tokens": 372, "duration": 0.1}
                w.append("evaluate", ev, step=s, ts=t)
            w.append("step_end", {"loss": val}, step=s, samples_seen=8 * s, ts=t)
            if s % 40 == 0:
                path = str(run / "checkpoints" / f"step-{s:06d}")
                save = {"checkpoint_path": path, "kind": ["full_state"], "duration": 1.0}
                w.append("save", save, step=s, ts=t)
                acc = min(1.0, max(0.0, acc + rng.uniform(-0.02, 0.05)))
                report = {"id": f"r{s}", "checkpoint_path": path, "step": s,
                          "metrics": {"accuracy": acc}, "source": "eval",
                          "delivery_id": None, "reported_at": t + 0.2}  # fmt: skip
                w.append("report", report, step=s, ts=t + 0.2)
        w.append(
            "train_end",
            {"status": "completed", "reason": f"reached step {steps}"},
            step=steps,
            ts=t + 1,
        )


def plain_pass(files: list[Path]) -> int:
    n = 0
    for f in files:
        with open(f, "rb") as fh:
            for line in fh:
                json.loads(line)
                n += 1
    return n


def in_process(files: list[Path]) -> int:
    from watcher.backtest.policies import stop_policies
    from watcher.backtest.replay import replay

    policies = stop_policies((SWEEP,), (), ())
    stopped = 0
    for f in files:
        got = replay(f, policies, None, [(None, None)], None)
        stopped += sum(s.stop_step is not None for s in got.stops)
    return stopped


def peak_rss_mb(argv: list[str]) -> tuple[float, float]:
    """(peak RSS in MB, wall s) of ``argv`` run to its end, read by a wrapper process
    (``getrusage`` of its children: this process's own children would mix in the others)."""
    code = (
        "import resource, subprocess, sys, time; t0 = time.perf_counter(); "
        "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, "
        "time.perf_counter() - t0)"
    )
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         check=True).stdout.split()  # fmt: skip
    return int(out[0]) / 1024, float(out[1])


def memory(tmp: Path, lines: int) -> dict[str, Any]:
    """The backtest's peak RSS on one journal of about ``lines`` records, and on 1k; and
    ``--hang-after auto`` (issue 58) on ``lines`` records with an eval, a declared phase, at
    every step."""
    policies = ["--early-stopping", SWEEP, "--divergence", "metric=loss"]
    out: dict[str, Any] = {}
    for name, n, every, args in (
        ("small", 1000, 20, policies),
        ("large", lines, 20, policies),
        ("hang_auto", lines, 1, ["--hang-after", "auto"]),
    ):
        write_journal(tmp / f"mem-{name}", 7, round(n / (3.05 + 1 / every)), fast=True,
                      eval_every=every)  # fmt: skip
        journal = tmp / f"mem-{name}" / "journal.jsonl"
        with open(journal, "rb") as f:
            records = sum(1 for _ in f)
        rss, wall = peak_rss_mb([str(BIN / "ilab-journal"), "backtest", *args, "--json",
                                 str(journal)])  # fmt: skip
        out[name] = {"records": records, "mb_on_disk": journal.stat().st_size / 1e6,
                     "peak_rss_mb": rss, "wall_s": wall}  # fmt: skip
    return out


def print_memory(mem: dict[str, Any]) -> None:
    print(
        f"{'backtest CLI peak RSS':<34} {'records':>10} {'MB file':>8} {'MB RSS':>8} {'wall s':>7}"
    )
    for name, m in mem.items():
        print(f"{'  ' + name:<34} {m['records']:>10,} {m['mb_on_disk']:>8.0f} "
              f"{m['peak_rss_mb']:>8.0f} {m['wall_s']:>7.2f}")  # fmt: skip
    print(f"{'  (Hardening 4: at most 300 MB)':<34}")


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    walls, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls), out


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--journals", type=int, default=None, help="default 100 (--quick: 20)")
    ap.add_argument("--steps", type=int, default=3300, help="steps per journal (~3 records each)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--memory-lines", type=int, default=None, help="default 1,000,000 (--quick: 200,000)"
    )
    ap.add_argument("--memory-only", action="store_true", help="only the peak RSS")
    args = ap.parse_args()
    n = args.journals or (20 if args.quick else 100)
    mem_lines = args.memory_lines or (200_000 if args.quick else 1_000_000)
    load_before = os.getloadavg()[0]  # other work on the machine skews every time below
    tmp = Path(tempfile.mkdtemp(prefix="bench-backtest-"))
    if args.memory_only:
        try:
            mem = memory(tmp, mem_lines)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if not args.json:
            print_memory(mem)
        policies = f"--early-stopping {SWEEP} --divergence metric=loss"
        emit("bench_backtest_memory", {"policies": policies, "memory": mem}, args.json)
        return
    try:
        mem = memory(tmp, mem_lines)
        originals = []
        for seed in range(4):
            write_journal(tmp / f"src{seed}", seed, args.steps)
            originals.append(tmp / f"src{seed}" / "journal.jsonl")
        files = []
        for i in range(n):
            dst = tmp / f"run{i:03d}"
            dst.mkdir()
            shutil.copy(originals[i % 4], dst / "journal.jsonl")
            files.append(dst / "journal.jsonl")
        records = plain_pass(files)
        plain_s, _ = timed(lambda: plain_pass(files), args.repeat)
        inproc_s, stopped = timed(lambda: in_process(files), args.repeat)
        argv = [
            str(BIN / "ilab-journal"),
            "backtest",
            *map(str, files),
            "--early-stopping",
            SWEEP,
            "--json",
        ]

        def run_cli() -> int:
            proc = subprocess.run(argv, capture_output=True, text=True, check=True)
            return len(proc.stdout.splitlines())

        cli_s, lines = timed(run_cli, args.repeat)
        assert lines == n, f"backtest printed {lines} runs of {n}"
        finished = str(originals[0].parent)  # as written, with its journal index

        def check(*exprs: str) -> int:
            argv = [str(BIN / "ilab-journal"), "check", finished, "--wait"]
            for e in exprs:
                argv += ["-e", e]
            return subprocess.run(argv, capture_output=True).returncode

        def status() -> int:
            cmd = [str(BIN / "ilab-journal"), "status", finished]
            return subprocess.run(cmd, capture_output=True).returncode

        def imports() -> int:  # what every ilab-journal command pays before its work
            cmd = [sys.executable, "-c", "import journal.cli.main"]
            return subprocess.run(cmd, capture_output=True).returncode

        gate = ("status in (completed, stopped)", "refused_reports == 0")
        check_s, check_rc = timed(lambda: check(*gate), max(5, args.repeat))
        metric_s, metric_rc = timed(lambda: check("best(accuracy) > 0"), max(5, args.repeat))
        status_s, _ = timed(status, max(5, args.repeat))
        import_s, _ = timed(imports, max(5, args.repeat))
        assert check_rc == metric_rc == 0, "check --wait failed on the finished run"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [
        ("plain json.loads", plain_s, 1.0),
        ("backtest in-process (8 policies)", inproc_s, inproc_s / plain_s),
        ("backtest CLI (8 policies)", cli_s, cli_s / plain_s),
    ]
    if not args.json:
        print(f"{n} journals, {records:,} records, sweep {SWEEP} ({stopped} stops found)")
        print(f"load average {load_before:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
        print(f"{'case':<34} {'wall s':>8} {'x plain':>8}")
        for name, wall, ratio in rows:
            print(f"{name:<34} {wall:>8.3f} {ratio:>8.2f}")
        print(f"{'check --wait (finished run)':<34} {check_s:>8.3f}   (status: {status_s:.3f} s)")
        print(f"{'check --wait best(accuracy)':<34} {metric_s:>8.3f}   (index + byte search)")
        print(f"{'python -c import journal.cli.main':<34} {import_s:>8.3f}   (in both of them)")
        print_memory(mem)
    emit(
        "bench_backtest",
        {
            "journals": n,
            "records": records,
            "sweep": SWEEP,
            "plain_json_s": plain_s,
            "backtest_inprocess_s": inproc_s,
            "backtest_cli_s": cli_s,
            "inprocess_x_plain": inproc_s / plain_s,
            "cli_x_plain": cli_s / plain_s,
            "check_wait_finished_s": check_s,
            "check_wait_metric_s": metric_s,
            "status_s": status_s,
            "cli_import_s": import_s,
            "memory": mem,
            "load_average": [load_before, os.getloadavg()[0]],
        },
        args.json,
    )


if __name__ == "__main__":
    main()
