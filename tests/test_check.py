"""``ilab-journal check``: a CI gate in one line over hand-built journals (the grammar,
its exit codes, --wait for a report that comes after train_end, refused reports) and
``status``'s stop_source (an eval's stop told from an operator's)."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from journal import JournalWriter, Report, submit_report
from journal.ask.expect import ExpectError, parse
from journal.cli.main import main
from journal.views.stops import stop_kind
from tests.helpers import begin_payload, cli

BEGIN = begin_payload(100, world_size=2, config={"keep_best": "accuracy:max", "keep_last_n": 2})


def build_run(
    run: Path,
    accuracies: list[float],
    *,
    stop_source: str | None = "eval:eval_accuracy.py",
    ts: float | None = None,
) -> None:
    """A run that saves every 10 steps, each checkpoint reported with its accuracy, and
    ends stopped by a command from ``stop_source`` (None: completed)."""
    with JournalWriter(run) as w:
        w.append("train_begin", BEGIN, ts=ts)
        step = 0
        for i, acc in enumerate(accuracies):
            step = 10 * (i + 1)
            w.append("log", {"loss": 2.0 / step, "lr": 1e-3}, step=step, ts=ts)
            w.append("evaluate", {"val_loss": 1.0 / step}, step=step, ts=ts)
            path = str(run / "checkpoints" / f"step-{step:06d}")
            w.append(
                "save",
                {"checkpoint_path": path, "kind": ["full_state"], "duration": 1.0},
                step=step,
                ts=ts,
            )
            w.append(
                "report",
                {
                    "id": f"r{step}",
                    "checkpoint_path": path,
                    "step": step,
                    "metrics": {"accuracy": acc},
                    "source": "eval",
                    "delivery_id": None,
                    "reported_at": 0.0,
                },
                step=step,
                ts=ts,
            )
        if stop_source is None:
            w.append("train_end", {"status": "completed", "reason": "done"}, step=step, ts=ts)
            return
        control = {"command": "stop", "id": "c1", "source": stop_source, "accepted": True}
        w.append(
            "control", {**control, "reason": "enough", "applied_at_step": step}, step=step, ts=ts
        )
        end = {"status": "stopped", "reason": "stop command: enough", "command": "stop"}
        w.append("train_end", {**end, "command_id": "c1"}, step=step, ts=ts)


def check(run: Path, *args: str) -> tuple[int, str]:
    got = CliRunner().invoke(main, ["check", str(run), *args])
    return got.exit_code, got.output


OLD = 1_000_000.0  # a run that ended long ago: nothing comes any more


def test_the_ci_gate_in_one_line(tmp_path: Path) -> None:
    build_run(tmp_path, [0.5, 0.92, 0.9], ts=OLD)
    gate = [
        "-e", "status in (completed, stopped) and stop_source in (eval, none)",
        "-e", "best(accuracy) >= 0.9",
        "-e", "reports(accuracy) >= 3",
        "-e", "refused_reports == 0",
        "-e", "last(val_loss) < 1.2",
    ]  # fmt: skip
    code, out = check(tmp_path, *gate)
    assert code == 0, out
    assert "ok    best(accuracy) >= 0.9  (best(accuracy) = 0.92)" in out
    code, out = check(tmp_path, "-e", "best(accuracy) >= 0.95", "-e", "steps >= 30")
    assert code == 1
    assert "FAIL  best(accuracy) >= 0.95  (best(accuracy) = 0.92)" in out
    assert "ok    steps >= 30  (steps = 30)" in out
    code, out = check(tmp_path, "--json", "-e", "best(accuracy:min) == 0.5")
    got = json.loads(out)
    assert (code, got["holds"], got["state"]) == (0, True, "stopped")
    assert got["expectations"][0]["values"] == {"best(accuracy:min)": 0.5}


@pytest.mark.parametrize(
    "bad",
    [
        *["stpes >= 10", "best(accuracy) >=", "status < 3", "median(accuracy) > 1", "steps"],
        "1 +",
        "steps >= " + "9" * 5000,  # past int()'s 4300 digits: was a ValueError, exit 1
        "steps >= 1e309",  # inf
        "(" * 500 + "steps >= 1" + ")" * 500,  # was a RecursionError
        "not " * 500 + "steps >= 1",
    ],
)
def test_a_bad_expression_is_one_line_exit_2(tmp_path: Path, bad: str) -> None:
    build_run(tmp_path, [0.5], ts=OLD)
    got = CliRunner().invoke(main, ["check", str(tmp_path), "-e", bad])
    assert got.exit_code == 2
    assert len(got.output.strip().splitlines()) == 1 and "Traceback" not in got.output
    with pytest.raises(ExpectError):
        parse(bad)


def test_grammar_logic_and_missing_values() -> None:
    facts = {"status": "stopped", "steps": 30, "best(accuracy)": None}
    assert parse("not (status == completed) and steps > 10").holds(facts)
    assert parse("status == completed or steps >= 30").holds(facts)
    assert parse("status not in (failed, interrupted)").holds(facts)
    assert not parse("best(accuracy) >= 0").holds(facts)  # no value never passes a bound
    assert parse("best(accuracy) == none").holds(facts)
    assert parse('status == "stopped"').holds(facts)


def test_a_run_that_cannot_be_judged_exits_with_its_status_code(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        w.append("train_begin", BEGIN)
        w.append("log", {"loss": 1.0, "lr": 1e-3}, step=1)
    code, _ = check(tmp_path, "-e", "steps >= 0")
    assert code == 3  # running: as status
    code, _ = check(tmp_path, "--stale-after", "0.001", "-e", "steps >= 0")
    assert code == 6


def test_refused_report_fails_the_gate(tmp_path: Path) -> None:
    build_run(tmp_path, [0.9], stop_source=None, ts=OLD)
    (tmp_path / "reports").mkdir(exist_ok=True)
    (tmp_path / "reports" / "bad.json").write_text('{"metrics": "not a dict"}')
    submit_report(tmp_path, Report({"accuracy": 0.95}, step=10), source="eval")  # journals both
    code, out = check(tmp_path, "-e", "refused_reports == 0")
    assert (code, out.strip()) == (1, "FAIL  refused_reports == 0  (refused_reports = 1)")


def test_wait_sees_a_report_that_comes_after_train_end(tmp_path: Path) -> None:
    """The lm-eval story: the last checkpoint's report comes after train_end. A gate at
    train_end sees 0.9; --wait waits for the quiet period and sees 1.0."""
    build_run(tmp_path, [0.5, 0.9])  # ended just now
    assert check(tmp_path, "-e", "best(accuracy) >= 1.0")[0] == 1  # without --wait: too early

    def late_report() -> None:
        time.sleep(0.5)  # the eval's own run time (not a synchronisation: any delay passes)
        ckpt = tmp_path / "checkpoints" / "step-000020"
        (ckpt / "full_state").mkdir(parents=True)
        (ckpt / "full_state" / ".metadata").write_bytes(b"x")
        submit_report(tmp_path, Report({"accuracy": 1.0}, checkpoint_path=ckpt, step=20))

    t = threading.Thread(target=late_report)
    t.start()
    try:
        code, out = check(tmp_path, "--wait", "30", "--quiet", "2", "-e", "best(accuracy) >= 1.0")
    finally:
        t.join()
    assert code == 0, out


def test_wait_on_a_settled_run_answers_at_once(tmp_path: Path) -> None:
    build_run(tmp_path, [0.5, 0.9], ts=OLD)
    proc = cli("ilab-journal", "check", str(tmp_path), "--wait", "-e", "steps == 20")
    assert proc.returncode == 0, proc.stderr  # (its time: benchmarks/bench_backtest.py)


def test_status_tells_an_eval_stop_from_an_operator_stop(tmp_path: Path) -> None:
    build_run(tmp_path / "eval", [0.5], ts=OLD)
    build_run(tmp_path / "op", [0.5], stop_source="laptop:4242", ts=OLD)
    for name, kind in (("eval", "eval"), ("op", "operator")):
        got = CliRunner().invoke(main, ["status", str(tmp_path / name), "--json"])
        s = json.loads(got.output)
        assert (got.exit_code, s["stop_source"]) == (4, kind)  # both exit 4, told apart
    assert check(tmp_path / "eval", "-e", "stop_source == eval")[0] == 0
    assert check(tmp_path / "op", "-e", "stop_source == eval")[0] == 1
    got = CliRunner().invoke(main, ["status", str(tmp_path / "op")])
    assert "stopped by  operator (laptop:4242)" in got.output


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("eval:eval_accuracy.py", "eval"),
        ("hook:save:run-12-abc", "eval"),
        ("hook:log:run-12-abc", "hook"),
        ("watcher:es:watcher.steering.EarlyStopping.on_evaluate", "early_stopping"),
        ("run_training:watcher.steering.DivergenceDetector.on_log", "divergence"),
        ("watcher:mine:cb.MyCallback.on_report", "callback"),
        ("web:alice", "web"),
        ("host-a:4242", "operator"),
        (None, "operator"),
    ],
)
def test_stop_kinds(source: str | None, kind: str) -> None:
    assert stop_kind(source) == kind


def test_control_in_a_hook_says_so(tmp_path: Path) -> None:
    """``ilab-journal control stop`` run by a watcher's command hook on a save: its source
    names the hook, so the stop counts as an eval's."""
    with JournalWriter(tmp_path) as w:  # a running run (an ended one takes no command)
        w.append("train_begin", BEGIN)
    env = {"ILAB_EVENT": "save", "ILAB_DELIVERY_ID": "run-40-abc"}
    got = CliRunner().invoke(main, ["control", "stop", str(tmp_path), "--id", "x1"], env=env)
    assert got.exit_code == 0, got.output
    body = json.loads((tmp_path / "control" / "x1.json").read_text())
    assert stop_kind(body["source"]) == "eval"


def test_wait_waits_for_a_job_in_flight_and_a_held_lease(tmp_path: Path) -> None:
    """What --wait waits on after train_end, read from the journal's job records and the
    leases: a job still RUNNING, a checkpoint still leased (an eval at work)."""
    from journal.ask.facts import FactFolder
    from journal.ask.settle import RunReading
    from journal.checkpoints.leases import acquire, release

    build_run(tmp_path, [0.5], stop_source=None, ts=OLD)
    job = {"id": "j1", "job_id": "42", "scheduler": "slurm", "node": None, "exit_code": None,
           "log_path": None, "checkpoint_path": None, "step": 10, "delivery_id": "d1",
           "hook": "eval", "attempt": 1, "source": "watcher:x", "reported_at": OLD}  # fmt: skip
    with JournalWriter(tmp_path, join=True) as w:
        w.append("job", {**job, "state": "RUNNING"}, step=10, ts=OLD)
    reading = RunReading(tmp_path / "journal.jsonl", FactFolder(set()))
    reading.read(final=True)
    assert any("in flight" in p for p in reading.pending(quiet=1.0, now=OLD + 100))
    with JournalWriter(tmp_path, join=True) as w:
        w.append("job", {**job, "state": "COMPLETED", "exit_code": 0}, step=10, ts=OLD)
    reading.read(final=True)  # only what the journal gained
    assert reading.pending(quiet=1.0, now=OLD + 100) == []
    ckpt = tmp_path / "checkpoints" / "step-000010"
    (ckpt / "full_state").mkdir(parents=True)
    (ckpt / "full_state" / ".metadata").write_bytes(b"x")
    lease = acquire(tmp_path, ckpt, ttl=60, holder="eval")
    assert any("leased" in p for p in reading.pending(quiet=1.0, now=time.time()))
    release(tmp_path, lease.id)
    assert reading.pending(quiet=1.0, now=time.time()) == []


def test_every_fact_and_function_is_documented() -> None:
    from journal.ask.expect import FACTS, FUNCTIONS
    from journal.views.stops import STOP_KINDS
    from tests.helpers import ROOT

    helped = CliRunner().invoke(main, ["check", "--help"]).output
    docs = (ROOT / "docs" / "cli.md").read_text()
    for name in [*FACTS, *(f"{f}(M)" for f in FUNCTIONS), *STOP_KINDS]:
        assert name in helped and f"`{name.split('(')[0]}" in docs, name


def test_from_the_index_or_every_record_the_same_values(tmp_path: Path) -> None:
    """A run as written (its journal index: the summary from it, metrics by a byte search)
    and its journal copied alone (every record read) give the same facts."""
    build_run(tmp_path / "run", [0.5, 0.92, 0.9], ts=OLD)
    assert (tmp_path / "run" / "journal.index.json").exists()
    (tmp_path / "copy").mkdir()
    shutil.copy(tmp_path / "run" / "journal.jsonl", tmp_path / "copy" / "journal.jsonl")
    gate = ["-e", "best(accuracy) > 0", "-e", "count(val_loss) == 3", "-e", "last(loss) > 0",
            "-e", "reports(accuracy) == 3", "-e", "stop_source == eval", "--json"]  # fmt: skip
    got = [json.loads(check(tmp_path / d, *gate)[1]) for d in ("run", "copy")]
    assert got[0]["expectations"] == got[1]["expectations"] and got[0]["holds"]


# -- names: a typo is refused, never read as a string (issue "One truth of a run", 6.1) ---


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ("stauts == completed", "unknown fact 'stauts' (did you mean 'status'?)"),
        ("stauts != failed", "unknown fact 'stauts' (did you mean 'status'?)"),  # was exit 0
        ("stauts", "unknown fact 'stauts' (did you mean 'status'?)"),
        ("steps >= stpes", "unknown fact 'stpes' (did you mean 'steps'?)"),
        ("steps in (10, stpes)", "unknown fact 'stpes' (did you mean 'steps'?)"),
        ("stpes >= 10", "unknown fact 'stpes' (did you mean 'steps'?)"),
        ("completed == status", "unknown fact 'completed'"),  # a string only on the right
        ("best(accuracy) > acc", "unknown fact 'acc'"),
        ("best(accuracy) == None", "unknown fact 'None' (did you mean 'none'?)"),
        ("bets(accuracy) > 0.5", "unknown function 'bets' (did you mean 'best'?)"),
        ("status != completd", "status is never 'completd' (did you mean 'completed'?)"),
        ("status in (completed, stoped)", "status is never 'stoped' (did you mean 'stopped'?)"),
        ("stop_source == operater", "stop_source is never 'operater' (did you mean 'operator'?)"),
    ],
)
def test_a_misspelt_name_is_refused_naming_the_closest(tmp_path: Path, bad: str, said: str) -> None:
    build_run(tmp_path, [0.5], ts=OLD)
    got = CliRunner().invoke(main, ["check", str(tmp_path), "-e", bad])
    assert got.exit_code == 2, got.output
    assert said in got.output and len(got.output.strip().splitlines()) == 1, got.output
    with pytest.raises(ExpectError, match=r"unknown|never"):
        parse(bad)


def test_a_bare_word_is_a_string_where_a_string_is_expected(tmp_path: Path) -> None:
    build_run(tmp_path, [0.5], ts=OLD)  # stopped by eval:eval_accuracy.py
    for expr in [
        "status in (completed, stopped)",
        "status == stopped",
        "status != failed",
        "stop_source in (eval, none) and status not in (failed, interrupted)",
        "stopped_by == 'eval:eval_accuracy.py'",  # no fixed words: any (a colon: quoted)
        "stop_reason != anything",
        "run_id != abc-123",
        'status == "stopped"',
    ]:
        code, out = check(tmp_path, "-e", expr)
        assert code == 0, (expr, out)
    assert check(tmp_path, "-e", "status in (completed, failed)")[0] == 1


def test_a_metric_a_settled_run_never_had_is_a_usage_error(tmp_path: Path) -> None:
    """Metrics are known only once the run is read: in a run that ended and settled, a
    metric it never had is exit 2 naming the closest one it has (count(val_los) == 0 held)."""
    build_run(tmp_path, [0.5, 0.9], ts=OLD)
    for expr, said in [
        ("best(accurcy) >= 0.5", "best(accurcy): the run has no metric 'accurcy' (did you mean 'accuracy'?)"),
        ("count(val_los) == 0", "did you mean 'val_loss'?"),  # held: exit 0 before
        ("last(zzz) > 1", "no metric 'zzz' (its metrics: accuracy, loss, lr, val_loss)"),
    ]:  # fmt: skip
        got = CliRunner().invoke(main, ["check", str(tmp_path), "--json", "-e", expr])
        assert got.exit_code == 2 and said in got.output, (expr, got.output)
        assert len(got.output.strip().splitlines()) == 1 and "Traceback" not in got.output
    code, out = check(tmp_path, "--wait", "5", "-e", "max(accurcy) > 0")  # settled at once
    assert code == 2 and "did you mean 'accuracy'?" in out


def test_a_metric_still_to_come_is_not_yet(tmp_path: Path) -> None:
    """Not settled (a record within --quiet: a report may still land): judged as none, said
    on stderr; the run's keep_best metric is known before its first report; a running run
    cannot be judged at all."""
    build_run(tmp_path / "fresh", [0.5])  # ended just now
    for wait in ([], ["--wait", "0.2", "--quiet", "60"]):
        code, out = check(tmp_path / "fresh", *wait, "-e", "best(accurcy) >= 0.5")
        assert code == 1, out
        assert "FAIL  best(accurcy) >= 0.5  (best(accurcy) = none)" in out
        assert "no metric 'accurcy' (did you mean 'accuracy'?); the run is not settled" in out
    build_run(tmp_path / "declared", [], stop_source=None, ts=OLD)  # keep_best accuracy:max
    code, out = check(tmp_path / "declared", "-e", "best(accuracy) >= 0.5")
    assert (code, out.strip()) == (1, "FAIL  best(accuracy) >= 0.5  (best(accuracy) = none)")
    with JournalWriter(tmp_path / "running") as w:
        w.append("train_begin", BEGIN)
    assert check(tmp_path / "running", "-e", "best(accurcy) >= 0.5")[0] == 3


# -- --wait for a run not there yet (issue "One truth of a run", 6.2) ----------------------


def test_without_wait_a_missing_or_starting_run_answers_at_once(tmp_path: Path) -> None:
    from journal.rundir.lock import RunLock

    code, out = check(tmp_path / "b", "-e", "steps > 0")
    assert code == 2 and "no such file or directory" in out and "waiting" not in out
    (tmp_path / "s").mkdir()
    lock = RunLock(tmp_path / "s")
    assert lock.try_acquire()
    try:
        code, out = check(tmp_path / "s", "-e", "steps > 0")
        assert code == 3 and "starting (no record yet)" in out, out
    finally:
        lock.release()


@pytest.mark.parametrize("starting", [False, True], ids=["no-dir", "starting"])
def test_wait_honours_its_deadline_when_nothing_comes(tmp_path: Path, starting: bool) -> None:
    """Nothing appears within --wait: judged as without it, after the wait (2 no such run,
    3 starting: status's codes), the wait said on stderr."""
    from journal.rundir.lock import RunLock

    run = tmp_path / "b"
    lock = RunLock(run)
    if starting:
        run.mkdir()
        assert lock.try_acquire()
    try:
        began = time.monotonic()
        code, out = check(run, "--wait", "0.5", "-e", "steps > 0")
        took = time.monotonic() - began
    finally:
        lock.release()
    assert code == (3 if starting else 2), out
    assert f"waiting for {run} to start" in out and "after waiting 0.5s" in out
    assert 0.5 <= took < 10


@pytest.mark.parametrize("starting", [False, True], ids=["no-dir", "starting"])
def test_wait_waits_for_a_run_that_appears(tmp_path: Path, starting: bool) -> None:
    """``check --wait`` started before the run: its dir (or, with a launcher holding it, its
    journal) appears while check waits; it is then read and judged as usual."""
    import subprocess

    from journal.rundir.lock import RunLock
    from tests.helpers import BIN, write_run

    run = tmp_path / "b"
    lock = RunLock(run)
    if starting:
        run.mkdir()
        assert lock.try_acquire()
    argv = [str(BIN / "ilab-journal"), "check", str(run), "--wait", "60", "--quiet", "0.3",
            "-e", "status == completed", "-e", "steps == 10"]  # fmt: skip
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        try:
            assert p.stderr is not None
            first = p.stderr.readline()  # blocks until check says it waits (or exits)
            assert f"waiting for {run} to start" in first, first
            assert p.poll() is None  # still waiting: the run is written only now
            write_run(run, steps=10)
            lock.release()
            out, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
            lock.release()
    assert p.returncode == 0, (out, err)
    assert "ok    status == completed" in out and "ok    steps == 10" in out
