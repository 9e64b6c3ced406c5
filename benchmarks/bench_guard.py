"""The hang guard (issues 53, 59), on the demo trainer at its usual step times (2 CPU ranks):

- a hang: ``kill -STOP`` of rank 1 at step 30 of a run that saves every 20 steps and
  evaluates every 20 (as ``make demo``), under ``ilab-train --hang-after auto --on-hang
  abort --max-restarts 1``; from the STOP to the alert (goal <= 10 s), from the alert to
  the ranks gone (<= 5 s), from then to the resumed attempt's first step (<= 60 s), beside
  what happens without the guard: the collective's own timeout (``--pg-timeout``, 1800 s)
  and no resume; alerts before the STOP (goal 0);
- a hang under two busy cores: the same while two busy loops (one a core) run from before
  the launch to the end: STOP to alert, and alerts before the STOP (goal 0);
- a 25 s lease wait (``--max-leased-checkpoints 1``, a lease held by hand) under
  ``--hang-after auto``: alerts raised (goal 0);
- a crash loop: ``kill -9`` of rank 1 of every attempt as soon as it began, under
  ``--max-restarts 10`` (``--max-no-progress-attempts`` at its default, 3): attempts
  launched (goal 3, not 11), from the first kill to the launcher's no-progress stop
  (exit 4), and the longest relaunch (from a kill to the next attempt's ``train_begin``);
- three notifiers on one run (issue 59): ``ilab-train --hang-after 5 --notify URL`` beside two
  ``ilab-watch --hang-after 5 --notify URL``, a real webhook on 127.0.0.1; rank 1 stopped,
  continued, then the run stopped: POSTs per incident (goal 1) and ``alert`` records;
- a hang cleared then repeated: rank 1 stopped, continued, stopped again at once: the
  recovery told, the second hang paged again (goal: 2 hang POSTs), no sooner than a minute
  after the first (the page limit of a flapping rank);
- false alarms: every journal of a real trainer under the roots given (default: ``runs/``,
  where ``make demo`` writes, the test suite's pytest temp dirs, and this benchmark's own
  runs, the busy one included) backtested with ``--hang-after auto`` (goal 0), alarms that
  end an attempt the guard aborted or whose workers died, or that a hang alert journaled
  for their attempt confirms, not counted as false.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import bench_parser, emit  # noqa: E402
from journal.read.reader import iter_records  # noqa: E402
from journal.rundir.phase import read_phase  # noqa: E402
from tests.helpers import kill_tree, wait_for  # noqa: E402
from tests.receiver import Receiver, serve  # noqa: E402
from watcher.alerts.hang import HangRule  # noqa: E402
from watcher.backtest.hangs import backtest_hangs  # noqa: E402

BIN = Path(sys.executable).parent
PG_TIMEOUT_S = 1800.0  # ilab-train's --pg-timeout default: a hung collective's own end


def _records(run: Path) -> list[dict[str, Any]]:
    path = run / "journal.jsonl"
    return list(iter_records(path, final=False)) if path.exists() else []


def _train(run: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "ilab-train"),
        "--demo",
        "--ckpt-dir",
        str(run),
        "--nproc-per-node",
        "2",
        "--quiet",
        *extra,
    ]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def hang_case(run: Path) -> dict[str, Any]:
    """One hang: STOP rank 1 at step 30 of a run that saves and evaluates every 20 steps."""
    argv = _train(run, "--max-steps", "100", "--save-every", "20", "--eval-every", "20")
    argv += ["--hang-after", "auto", "--on-hang", "abort", "--max-restarts", "1"]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    try:
        begin = wait_for(
            lambda: next((r for r in _records(run) if r["event"] == "train_begin"), None),
            300,
            "train_begin",
        )
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 30 for r in _records(run)),
            300,
            "step 30",
        )
        steps = [r for r in _records(run) if r["event"] == "step_end"]
        step_s = (steps[-1]["ts"] - steps[1]["ts"]) / max(len(steps) - 2, 1)
        rank1 = next(r["pid"] for r in begin["data"]["ranks"] if r["rank"] == 1)
        stopped_at = time.time()
        os.kill(rank1, signal.SIGSTOP)
        _, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    if job.returncode != 0:
        raise SystemExit(f"bench_guard: the restarted run failed:\n{err.decode()[-3000:]}")
    recs = _records(run)
    alerts = [r for r in recs if r["event"] == "alert"]
    alert = next(
        r for r in alerts if r["data"]["kind"] == "hang" and r["data"]["raised_at"] >= stopped_at
    )
    marker = orjson.loads((run / "alerts" / alert["data"]["id"] / "abort.json").read_bytes())
    resumed = next(r for r in recs if r["event"] == "step_end" and r["attempt"] == 2)
    threshold = re.search(r"threshold (\d+)s", alert["data"]["message"])
    raised = alert["data"]["raised_at"]
    return {
        "step_s": step_s,
        "threshold_s": float(threshold.group(1)) if threshold else None,
        "stop_to_alert_s": raised - stopped_at,
        "alert_to_abort_s": marker["ended_at"] - raised,
        "abort_to_resumed_step_s": resumed["ts"] - marker["ended_at"],
        "stop_to_resumed_step_s": resumed["ts"] - stopped_at,
        "resumed_at_step": resumed["step"],
        "alerts_before_stop": sum(r["data"]["raised_at"] < stopped_at for r in alerts),
    }


def busy_hang_case(run: Path) -> dict[str, Any]:
    """:func:`hang_case` while both cores are busy (a busy loop each, started before the
    launch and stopped after the run)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        got = hang_case(run)
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    keys = ("step_s", "threshold_s", "stop_to_alert_s", "alerts_before_stop")
    return {f"busy_{k}": got[k] for k in keys}


def lease_wait_case(run: Path, pause_s: float = 25.0) -> dict[str, Any]:
    """A lease wait of ``pause_s`` before a save (a lease held by hand, released that long
    after rank 0 declared the wait), guarded with --hang-after auto: alerts raised."""
    first = subprocess.run(
        _train(run, "--max-steps", "2", "--save-every", "2"), capture_output=True, env=_env()
    )
    if first.returncode != 0:
        raise SystemExit(f"bench_guard: {first.stderr.decode()[-2000:]}")
    lease = [str(BIN / "ilab-journal"), "lease", str(run), "step-000002", "--ttl", "3600"]
    lease_id = subprocess.run(lease, check=True, capture_output=True, text=True, env=_env())
    argv = _train(run, "--max-steps", "6", "--save-every", "2", "--max-leased-checkpoints", "1")
    job = subprocess.Popen(
        [*argv, "--hang-after", "auto"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    try:
        waiting = wait_for(
            lambda: (p := read_phase(run)) is not None and p.name == "lease_wait" and p,
            300,
            "the lease wait",
        )
        wait_for(lambda: time.time() >= waiting.since + pause_s, pause_s + 5, "the pause")
        release = [str(BIN / "ilab-journal"), "release", str(run), lease_id.stdout.strip()]
        subprocess.run(release, check=True, capture_output=True, env=_env())
        _, err = job.communicate(timeout=300)
    finally:
        if job.poll() is None:
            job.kill()
    if job.returncode != 0:
        raise SystemExit(f"bench_guard: {err.decode()[-2000:]}")
    recs = _records(run)
    waited = max(r["data"].get("lease_wait_s") or 0 for r in recs if r["event"] == "save")
    alerts = sum(r["event"] == "alert" for r in recs)
    return {"lease_wait_s": waited, "lease_wait_alerts": alerts}


def crash_loop_case(run: Path, most: int = 10) -> dict[str, Any]:
    """A crash loop: rank 1 of each attempt killed at its ``train_begin`` (nothing saved),
    under ``--max-restarts most``; until the launcher stops relaunching."""
    argv = _train(run, "--max-steps", "100", "--max-restarts", str(most), "--notify-on", "failed")
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env())
    killed: dict[int, float] = {}  # attempt -> when its rank 1 was killed
    try:
        while job.poll() is None:
            begins = [r for r in _records(run) if r["event"] == "train_begin"]
            for begin in (b for b in begins if b["attempt"] not in killed):
                rank1 = next(r["pid"] for r in begin["data"]["ranks"] if r["rank"] == 1)
                os.kill(rank1, signal.SIGKILL)
                killed[begin["attempt"]] = time.time()
            time.sleep(0.1)  # a poll of the journal, not a synchronisation
        stopped_at = time.time()
        _, err = job.communicate(timeout=600)
    finally:
        if job.poll() is None:
            job.kill()
    if job.returncode != 4:
        raise SystemExit(
            f"bench_guard: the crash loop ended {job.returncode}:\n{err.decode()[-3000:]}"
        )
    begins = {r["attempt"]: r["ts"] for r in _records(run) if r["event"] == "train_begin"}
    return {
        "crash_loop_max_restarts": most,
        "crash_loop_attempts": len(begins),
        "crash_loop_first_kill_to_stop_s": stopped_at - killed[1],
        "crash_loop_relaunch_to_begin_s": max(
            begins[a] - killed[a - 1] for a in begins if a > 1 and a - 1 in killed
        ),
    }


def _posts(got: Receiver, kind: str) -> list[dict[str, Any]]:
    """The messages the webhook got about alerts of ``kind`` (their title names it)."""
    return [b for b in got.bodies if b["title"].startswith(f"[ilab] {kind}: ")]


def _notified_run(run: Path, url: str) -> tuple[subprocess.Popen[bytes], int]:
    """A long demo run under ``--hang-after 5 --notify URL`` at step 10; rank 1's pid."""
    argv = _train(run, "--max-steps", "3000", "--num-epochs", "50", "--hang-after", "5")
    job = subprocess.Popen(
        [*argv, "--notify", url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_env()
    )
    begin = wait_for(
        lambda: next((r for r in _records(run) if r["event"] == "train_begin"), None),
        300,
        "train_begin",
    )
    wait_for(
        lambda: any(r["event"] == "step_end" and r["step"] >= 10 for r in _records(run)),
        300,
        "step 10",
    )
    return job, next(r["pid"] for r in begin["data"]["ranks"] if r["rank"] == 1)


def _stop_run(run: Path, job: subprocess.Popen[bytes]) -> None:
    stop = [str(BIN / "ilab-journal"), "control", "stop", str(run)]
    subprocess.run(stop, check=True, capture_output=True, env=_env())
    _, err = job.communicate(timeout=300)
    if job.returncode != 0:
        raise SystemExit(f"bench_guard: {err.decode()[-2000:]}")


def _all_looked_since(run: Path, since: float, n: int) -> bool:
    """Each of the ``n`` guards' heartbeats (alerts/guards/) says it looked after ``since``."""
    beats = [orjson.loads(p.read_bytes()) for p in (run / "alerts" / "guards").glob("*.json")]
    return len(beats) == n and all(b["looked_at"] > since for b in beats)


def notifiers_case(run: Path) -> dict[str, Any]:
    """Three notifiers on one run: the launcher's guard and two ilab-watch guards, each with
    --hang-after 5 and the same webhook. Rank 1 stopped (a hang), continued (its recovery),
    the run stopped: how many POSTs each incident made, and the ``alert`` records."""
    with serve() as got:
        job, rank1 = _notified_run(run, got.url)
        argv = [str(BIN / "ilab-watch"), str(run), "--hang-after", "5", "--notify", got.url]
        watchers = [  # each its own --name: a cursor of its own
            subprocess.Popen([*argv, "--name", n], stderr=subprocess.DEVNULL, env=_env())
            for n in ("bench-a", "bench-b")
        ]
        try:
            started = time.time()
            wait_for(lambda: _all_looked_since(run, started, 3), 120, "three guards")
            stopped_at = time.time()
            os.kill(rank1, signal.SIGSTOP)
            wait_for(lambda: _posts(got, "hang"), 120, "the hang's POST")
            posted_at = time.time()
            wait_for(lambda: _all_looked_since(run, posted_at + 6, 3), 60, "every guard's look")
            os.kill(rank1, signal.SIGCONT)
            wait_for(lambda: _posts(got, "recovered"), 120, "the recovery's POST")
            told = time.time()
            wait_for(lambda: _all_looked_since(run, told + 6, 3), 60, "every guard's look")
            _stop_run(run, job)
            for w in watchers:
                w.wait(timeout=60)
        finally:
            if job.poll() is None:
                kill_tree(job.pid)
            for w in watchers:
                w.kill()
        posts = {k: len(_posts(got, k)) for k in ("hang", "recovered", "stopped")}
    alerts = [r["data"]["kind"] for r in _records(run) if r["event"] == "alert"]
    return {
        "notifiers": 3,
        "notifiers_stop_to_hang_post_s": posted_at - stopped_at,
        **{f"notifiers_{k}_posts": v for k, v in posts.items()},
        "notifiers_posts_per_incident": max(posts.values()),
        "notifiers_alert_records": len(alerts),
    }


def hang_repeat_case(run: Path) -> dict[str, Any]:
    """A hang cleared then repeated: ``ilab-train --hang-after 5 --notify URL``; rank 1
    stopped, continued once its hang was paged, stopped again as soon as its recovery was:
    when each was told, and the second hang's page after the first."""
    with serve() as got:
        job, rank1 = _notified_run(run, got.url)
        try:
            first_stop = time.time()
            os.kill(rank1, signal.SIGSTOP)
            wait_for(lambda: _posts(got, "hang"), 120, "the first hang's POST")
            first_post = time.time()
            os.kill(rank1, signal.SIGCONT)
            wait_for(lambda: _posts(got, "recovered"), 120, "the recovery's POST")
            recovered = time.time()
            os.kill(rank1, signal.SIGSTOP)
            wait_for(lambda: len(_posts(got, "hang")) == 2, 180, "the second hang's POST")
            second_post = time.time()
            os.kill(rank1, signal.SIGCONT)
            _stop_run(run, job)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(rank1, signal.SIGCONT)
            if job.poll() is None:
                kill_tree(job.pid)
        hangs, recoveries = len(_posts(got, "hang")), len(_posts(got, "recovered"))
    return {
        "repeat_stop_to_hang_post_s": first_post - first_stop,
        "repeat_cont_to_recovered_post_s": recovered - first_post,
        "repeat_second_hang_post_after_first_s": second_post - first_post,
        "repeat_hang_posts": hangs,
        "repeat_recovered_posts": recoveries,
    }


def _real(journal: Path) -> bool:
    """A journal a real trainer wrote: its first train_begin names the Python it ran (the
    tests' made-up journals name a torch alone). Judged by its first MiB: the tests leave
    hostile ones (a sparse file of 64 GiB, no newline)."""
    try:
        with journal.open("rb") as f:
            for line in f.read(1 << 20).splitlines():
                if b'"train_begin"' in line:
                    rec = orjson.loads(line)
                    if not isinstance(rec, dict) or not isinstance(rec.get("data"), dict):
                        return False
                    versions = rec["data"].get("versions")
                    return rec.get("event") == "train_begin" and "python" in (versions or ())
    except (OSError, orjson.JSONDecodeError):
        return False
    return False


def false_alarms(roots: list[Path], rule: HangRule) -> dict[str, Any]:
    """Every real trainer's journal under ``roots``, backtested with ``rule``."""
    journals = sorted({p.resolve() for root in roots for p in root.rglob("journal.jsonl")})
    # a regular file only: the tests leave hostile ones (a FIFO's open() blocks forever)
    journals = [p for p in journals if p.is_file() and _real(p)]
    results = [backtest_hangs(p, rule) for p in journals]
    false = [
        f"{r.journal}: attempt {a.attempt} step {a.step} ({a.quiet_s:.1f}s > {a.threshold_s:.1f}s)"
        for r in results
        for a in r.alarms
        if a.false
    ]
    return {
        "journals": len(results),
        "attempts": sum(r.attempts for r in results),
        "steps": sum(r.steps for r in results),
        "alarms": sum(len(r.alarms) for r in results),
        "false_alarms": len(false),
        "false_alarm_list": false[:20],
    }


def _load() -> str:
    """The machine's load averages (1, 5, 15 min): other work running alongside."""
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument(
        "--roots",
        nargs="*",
        type=Path,
        default=[ROOT / "runs", Path(tempfile.gettempdir()) / f"pytest-of-{getpass.getuser()}"],
        help="where to look for journals to backtest (besides this benchmark's own runs)",
    )
    args = ap.parse_args()
    repeats = 1 if args.quick else 2
    result: dict[str, Any] = {"collective_timeout_s": PG_TIMEOUT_S, "load_avg_start": _load()}
    with tempfile.TemporaryDirectory(prefix="bench-guard-") as d:
        try:
            cases = [hang_case(Path(d) / f"hang-{i}") for i in range(repeats)]
            for key in cases[0]:
                values = [c[key] for c in cases if c[key] is not None]
                result[key] = max(values) if values else None  # the worst of the repeats
            result.update(busy_hang_case(Path(d) / "busy"))
            result.update(lease_wait_case(Path(d) / "lease"))
            result.update(crash_loop_case(Path(d) / "crash-loop"))
            result.update(notifiers_case(Path(d) / "notifiers"))
            result.update(hang_repeat_case(Path(d) / "repeat"))
        except AssertionError as exc:  # wait_for's deadline: one line
            raise SystemExit(f"bench_guard: {exc}") from None
        roots = [r for r in args.roots if r.is_dir()] + [Path(d)]
        for name, rule in (("auto", HangRule(None)),):
            for k, v in false_alarms(roots, rule).items():
                result[f"backtest_{name}_{k}"] = v
    result["load_avg_end"] = _load()
    result["goals_met"] = bool(
        result["stop_to_alert_s"] <= 10
        and result["alert_to_abort_s"] <= 5
        and result["abort_to_resumed_step_s"] <= 60
        and result["alerts_before_stop"] == 0
        and result["busy_alerts_before_stop"] == 0
        and result["lease_wait_alerts"] == 0
        and result["crash_loop_attempts"] == 3
        and result["backtest_auto_false_alarms"] == 0
        and result["notifiers_posts_per_incident"] == 1
        and result["repeat_hang_posts"] == 2
        and result["repeat_second_hang_post_after_first_s"] >= 60
    )
    emit("bench_guard", result, args.json)


if __name__ == "__main__":
    main()
