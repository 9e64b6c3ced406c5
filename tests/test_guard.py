"""The hang and death rules, the evidence a hang alert carries and the guard's options,
without a training run (the 2-rank runs are in tests/test_hang.py).

The rules are pure (watcher/alerts/hang.py, died.py): fed records and a clock, they say
what the live guard and the backtest say. The evidence is taken from real processes; the
processes a journal names, which the guard must never signal, are the test's own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter
from journal.rundir.phase import Phase, PhaseMarker, read_phase
from journal.rundir.procs import boot_id, start_time
from tests.helpers import BIN, begin_payload, cli, records, wait_for
from watcher.alerts.evidence import collect
from watcher.alerts.guard import Guard, GuardOptions
from watcher.alerts.hang import (
    AUTO_FLOOR_S,
    AttemptTracker,
    HangRule,
    HangSpecError,
    check,
)
from watcher.alerts.processes import Proc, ProcessView, this_host
from watcher.alerts.sink import AlertDispatcher

T0 = 1_800_000_000.0


def _rec(event: str, ts: float, step: int, **data: Any) -> dict[str, Any]:
    return {"event": event, "ts": ts, "step": step, "run_id": "r1", "attempt": 1, "data": data}


def _tracker(step_s: float = 0.5, steps: int = 10) -> AttemptTracker:
    """An attempt that made ``steps`` steps of ``step_s`` seconds from T0."""
    t = AttemptTracker()
    t.observe(_rec("train_begin", T0, 0, ranks=[]))
    for i in range(1, steps + 1):
        t.observe(_rec("step_end", T0 + i * step_s, i))
    return t


def test_hang_after_takes_seconds_or_auto() -> None:
    assert HangRule.parse("auto") == HangRule(None)
    assert HangRule.parse(" 2.5 ").after_s == 2.5
    for bad in ("0", "-3", "soon", "nan", "inf"):
        with pytest.raises(HangSpecError):
            HangRule.parse(bad)


def test_quiet_longer_than_the_threshold_outside_a_phase_is_a_hang() -> None:
    t = _tracker()
    last = T0 + 5.0
    rule = HangRule(10.0)
    assert check(t, None, last + 9.9, rule) is None
    found = check(t, None, last + 10.5, rule)
    assert found is not None and found.step == 10 and found.phase is None
    assert found.quiet_s == pytest.approx(10.5) and "no step progress" in found.message


def test_a_declared_lease_wait_of_25s_is_no_hang_but_one_past_its_bound_is() -> None:
    """The pacer's own bound (its limit) plus the threshold: a 25 s wait never alarms."""
    t = _tracker()
    rule = HangRule(5.0)
    wait = Phase("lease_wait", T0 + 5.0, "r1", 1, limit_s=1350.0)
    assert check(t, wait, T0 + 5.0 + 25.0, rule) is None
    late = check(t, wait, T0 + 5.0 + 1356.0, rule)
    assert late is not None and late.phase == "lease_wait"
    # the phase over: the quiet counts from its end, not from the last step
    over = Phase(None, T0 + 30.0, "r1", 1)
    assert check(t, over, T0 + 34.0, rule) is None
    assert check(t, over, T0 + 36.0, rule) is not None


def test_a_bridge_ends_its_first_step_with_its_first_record_of_a_later_step() -> None:
    """The Accelerate bridge writes no step_end, only a log at each step: its first log of
    step 1 ends the first step, and each later step's is its boundary (an auto threshold
    from its steps); a step_end-less journal of ilab-train's own stays in its first step."""
    rule = HangRule(30.0, first_step_s=5.0)
    bridge = AttemptTracker()
    bridge.observe(_rec("train_begin", T0, 0, trainer="accelerate", pid=1))
    assert check(bridge, None, T0 + 5.5, rule) is not None  # the first step past its limit
    for i in range(1, 5):
        bridge.observe(_rec("log", T0 + 2.0 * i, i, loss=1.0))
        bridge.observe(_rec("save", T0 + 2.0 * i + 0.1, i))  # same step: no boundary
    assert bridge.steps == 4 and bridge.last_step == 4 and list(bridge.step_times) == [2.0] * 4
    assert check(bridge, None, T0 + 30.0, rule) is None  # past the first-step limit: fine
    found = check(bridge, None, T0 + 8.0 + 31.0, rule)
    assert found is not None and found.phase is None and found.step == 4
    native = AttemptTracker()
    native.observe(_rec("train_begin", T0, 0, ranks=[]))
    native.observe(_rec("log", T0 + 2.0, 1, loss=1.0))
    late = check(native, None, T0 + 6.0, rule)
    assert late is not None and late.phase == "first_step" and late.threshold_s == 5.0


def test_a_phase_file_of_another_attempt_says_nothing() -> None:
    t = _tracker()
    other = Phase("save", T0 + 5.0, "r1", 2)
    assert check(t, other, T0 + 20.0, HangRule(5.0)) is not None


def test_auto_is_a_high_quantile_of_the_step_times_times_3_plus_a_floor() -> None:
    """auto: 3x the 90th percentile of the last 100 step times plus 4 s: the warm-up and a
    step a save slowed are left out once 10 steps are known, and count until then."""
    rule = HangRule(None)
    assert rule.threshold(_tracker(step_s=0.5).step_times) == pytest.approx(1.5 + AUTO_FLOOR_S)
    assert rule.threshold(_tracker(step_s=4.0).step_times) == pytest.approx(16.0)
    t = AttemptTracker()
    t.observe(_rec("train_begin", T0, 0))
    now = T0
    for step, took in enumerate([3.0] + [0.5] * 19 + [2.5] + [0.5] * 8, start=1):
        now += took
        t.observe(_rec("step_end", now, step))
        if step == 2:  # the warm-up is the longest known: it counts
            assert rule.threshold(t.step_times) == pytest.approx(9.0 + AUTO_FLOOR_S)
    assert rule.threshold(t.step_times) == pytest.approx(1.5 + AUTO_FLOOR_S)
    assert check(t, None, now + 5.4, rule) is None
    assert check(t, None, now + 5.6, rule) is not None
    # the first step (warm-up) is in a phase of its own
    t = AttemptTracker()
    t.observe(_rec("train_begin", T0, 0))
    assert check(t, None, T0 + 500.0, rule) is None  # first step: at least 600 s
    assert check(t, None, T0 + 601.0, rule) is not None


def test_time_spent_in_a_save_is_not_a_step_time() -> None:
    t = _tracker(step_s=1.0, steps=3)
    t.observe(_rec("save", T0 + 40.0, 4, blocked_s=36.5, lease_wait_s=0.0))
    t.observe(_rec("step_end", T0 + 40.0, 4))
    assert max(t.step_times) == pytest.approx(1.0)


def test_the_phase_marker_writes_what_the_detector_reads(tmp_path: Path) -> None:
    marker = PhaseMarker(tmp_path, run_id="r1", attempt=3)
    with marker("save"):
        got = read_phase(tmp_path)
        assert got is not None and (got.name, got.run_id, got.attempt) == ("save", "r1", 3)
        with marker("eval"):  # nested: the outer phase stands
            assert read_phase(tmp_path).name == "save"  # type: ignore[union-attr]
    after = read_phase(tmp_path)
    assert after is not None and after.name is None and after.since >= got.since
    (tmp_path / "phase.json").write_text('{"name": "nap", "since": 1}')
    assert read_phase(tmp_path) is None  # not a phase a trainer declares


def test_evidence_has_each_local_stack_and_says_what_it_could_not_take(
    tmp_path: Path,
) -> None:
    """A real Python process stands in for a local rank, stopped like a hung one; a rank on
    another host cannot be dumped from here: one line says so, the rest is taken."""
    code = (
        "import time\n"
        "def blocked_in_collective():\n"
        "    print('in', flush=True)\n"
        "    time.sleep(120)\n"
        "blocked_in_collective()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        view = ProcessView()
        view.procs = {
            proc.pid: Proc("rank 0", proc.pid, None, rank=0),
            99999999: Proc("rank 1", 99999999, "other-host", rank=1),
        }
        assert proc.stdout is not None and proc.stdout.readline() == "in\n"  # in the call
        proc.send_signal(signal.SIGSTOP)
        stat = Path(f"/proc/{proc.pid}/stat")
        wait_for(
            lambda: stat.read_text().rsplit(")", 1)[1].split()[0] == "T", 10, "stopped"
        )  # SIGSTOP: read without pausing it again (--nonblocking)
        view.update()
        ev = collect(tmp_path, tmp_path / "alerts" / "a1", view, summary="hang", nccl=False)
    finally:
        proc.kill()
        proc.wait()
    assert "alerts/a1/processes.txt" in ev.files and "alerts/a1/rank-0.txt" in ev.files
    stack = (tmp_path / "alerts" / "a1" / "rank-0.txt").read_text()
    assert "blocked_in_collective" in stack
    listing = (tmp_path / "alerts" / "a1" / "processes.txt").read_text()
    assert f"rank 0: pid {proc.pid}: stopped" in listing
    assert len(ev.missing) == 1 and "rank(s) 1" in ev.missing[0] and "other-host" in ev.missing[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--on-hang", "abort"], "--on-hang abort needs --hang-after"),
        (["--hang-after", "soon"], "SECONDS or auto"),
        (["--first-step-limit", "60"], "--first-step-limit needs --hang-after"),
        (["--hang-after", "5", "--first-step-limit", "0"], "--first-step-limit"),
        (["--hang-after", "5", "--replay"], "ilab-journal backtest"),
    ],
)
def test_guard_option_mistakes_are_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], says: str
) -> None:
    (tmp_path / "journal.jsonl").write_text("")
    out = cli("ilab-watch", str(tmp_path), *argv)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr and "Traceback" not in out.stderr


def test_ilab_train_refuses_abort_without_hang_after(tmp_path: Path) -> None:
    out = cli("ilab-train", "--demo", "--ckpt-dir", str(tmp_path / "r"), "--on-hang", "abort")
    assert out.returncode == 2 and "--on-hang abort needs --hang-after" in out.stderr
    assert "Traceback" not in out.stderr


def _quiet_run(run: Path, begin: dict[str, Any], quiet_s: float = 120.0) -> JournalWriter:
    """A journal (its writer, still open) whose attempt made 5 one-second steps and went
    quiet ``quiet_s`` ago, as its records' own times say: a guard sees the hang at once."""
    w = JournalWriter(run)
    t0 = time.time() - quiet_s - 5.0
    w.append("train_begin", {**begin_payload(100), **begin}, ts=t0)
    for step in range(1, 6):
        w.append("step_end", step=step, ts=t0 + step)
    return w


def _as_rank(rank: int, pid: int) -> dict[str, Any]:
    """Every field a rank records of itself, copied from any process: all readable by
    anyone (its host, pid, start time and the machine's boot)."""
    who = {"host": this_host(), "pid": pid, "start": start_time(pid), "boot": boot_id()}
    return {"rank": rank, "local_rank": rank, **who}


def _sleeps(n: int) -> list[subprocess.Popen[Any]]:
    return [subprocess.Popen(["sleep", "300"]) for _ in range(n)]


def _first_alert(run: Path) -> dict[str, Any] | None:
    return next((r["data"] for r in records(run) if r["event"] == "alert"), None)


#: How a journal may name processes it never started: as ranks with every field a rank
#: records; as a day-old crashed run's ranks (no host, no start time: pids get reused);
#: as a bridge's trainer (``data.pid``).
FORMS: dict[str, Callable[[list[int]], dict[str, Any]]] = {
    "ranks": lambda pids: {"ranks": [_as_rank(i, p) for i, p in enumerate(pids)]},
    "no hosts": lambda pids: {"ranks": [{"rank": i, "pid": p} for i, p in enumerate(pids)]},
    "bridge": lambda pids: {"hostname": this_host(), "pid": pids[0]},
}


@pytest.mark.parametrize(
    ("form", "after", "why"),
    [
        ("ranks", "5", "rank 0 (pid {pid}) runs no worker config of {run}: sleep 300"),
        ("ranks", "auto", "rank 0 (pid {pid}) runs no worker config of {run}: sleep 300"),
        ("no hosts", "5", "rank 0 (pid {pid}) was recorded on host (none), not {host}"),
        ("bridge", "5", "rank 0 (pid {pid}) is a bridge's trainer: only its own launcher"),
    ],
)
def test_a_journal_never_chooses_what_is_killed(
    tmp_path: Path, form: str, after: str, why: str
) -> None:
    """A journal is data anyone who can write the run dir controls. One that names the
    test's own sleeps as its hung attempt's processes: ``ilab-watch --on-hang abort``
    raises the hang, signals none of them, and its alert says in one line what could not
    be verified (only a live rank its attempt launched, running this run's worker config,
    is ended)."""
    sleeps = _sleeps(2)
    run = tmp_path / "run"
    watch: subprocess.Popen[Any] | None = None
    try:
        _quiet_run(run, FORMS[form]([p.pid for p in sleeps])).close()
        argv = [str(BIN / "ilab-watch"), str(run), "--hang-after", after, "--on-hang", "abort"]
        watch = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
        alert = wait_for(lambda: _first_alert(run), 120, "the hang alert")
        watch.terminate()  # an abort under way would finish first
        _, err = watch.communicate(timeout=60)
        alive = [p.poll() is None for p in sleeps]
    finally:
        for p in [*sleeps, *([watch] if watch else [])]:
            p.kill()
            p.wait()
    assert alive == [True, True], err[-3000:]
    said = why.format(pid=sleeps[0].pid, run=run, host=this_host())
    assert alert["kind"] == "hang" and f"; not aborted: {said}" in alert["message"], alert
    assert alert["message"].endswith("(--on-hang abort)") and "\n" not in alert["message"]
    assert ("(and 1 more)" in alert["message"]) == (form != "bridge")
    assert not list(run.glob("alerts/*/abort.json"))
    assert not [r for r in records(run) if r["event"] == "train_end"]


def test_a_flapping_rank_pages_once_a_minute_and_evidence_is_gathered_for_raised_hangs(
    tmp_path: Path,
) -> None:
    """--hang-after 1 with 2 s steps: each step's quiet is a hang to the rule. The first is
    raised, the step that ends it tells its recovery, and the hangs that follow within a
    minute wait (no alert, no evidence); one that lasts past the minute is raised: a new
    incident, with evidence of its own."""
    [sleep] = _sleeps(1)
    run = tmp_path / "run"
    sink = AlertDispatcher(run, run_label=str(run))
    try:
        with _quiet_run(run, {"ranks": [_as_rank(0, sleep.pid)]}, quiet_s=0.0) as w:
            guard = Guard(run, sink, GuardOptions(hang=HangRule(1.0)))
            now = time.time()
            for step in range(6, 16):
                now += 2.0
                guard.tick(now)  # on the guard's clock: 2 s of quiet
                w.append("step_end", step=step, ts=now)
            guard.tick(now + 61.0)  # a quiet that outlasts the minute
    finally:
        sink.close(1.0)
        sleep.kill()
        sleep.wait()
    assert [(a.kind, a.step) for a in sink.raised] == [("hang", 5), ("recovered", 6), ("hang", 15)]
    first, recovered, second = sink.raised
    assert recovered.resolves == first.id and recovered.incident == first.incident
    evidence = {d.name for d in (run / "alerts").iterdir()} - {"claims", "guards"}
    assert evidence == {first.id, second.id}


def test_a_stack_is_captured_whatever_the_watchers_locale(tmp_path: Path) -> None:
    """py-spy writes UTF-8: a watcher whose locale is ASCII still raises its hang alert,
    with the hung process's stack and its names intact."""
    code = "import time\ndef café_wait():\n    time.sleep(300)\ncafé_wait()\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    run = tmp_path / "run"
    watch: subprocess.Popen[Any] | None = None
    try:
        _quiet_run(run, {"ranks": [_as_rank(0, proc.pid)]}).close()
        ascii_env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
        argv = [str(BIN / "ilab-watch"), str(run), "--hang-after", "5"]
        watch = subprocess.Popen(argv, stderr=subprocess.PIPE, env=ascii_env)
        alert = wait_for(lambda: _first_alert(run), 120, "the hang alert")
    finally:
        for p in [proc, *([watch] if watch else [])]:
            p.kill()
            p.wait()
    stack = f"alerts/{alert['id']}/rank-0.txt"
    assert stack in alert["evidence"], alert
    assert "café_wait" in (run / stack).read_text("utf-8")
