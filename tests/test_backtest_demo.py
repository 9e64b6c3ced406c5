"""The story of issue 46 on a real 2-rank demo run (``examples/demo.py``: training, the
watcher's eval of each checkpoint with its accuracy target, early stopping): the CI gate
in one ``check`` line, and backtests of that run that reproduce its stop and show what
patience 1 would have cost. A few minutes: extended suite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, cli, pythonpath


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("demo") / "run"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "demo.py"), "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return run


@pytest.mark.extended
def test_the_gate_in_one_line_on_the_demo(demo_run: Path) -> None:
    gate = ["-e", "status in (completed, stopped)", "-e", "refused_reports == 0",
            "-e", "reports(accuracy) >= 1", "-e", "stop_source in (eval, early_stopping, none)"]  # fmt: skip
    proc = cli("ilab-journal", "check", str(demo_run), "--wait", "120", "--quiet", "3", *gate)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    status = json.loads(cli("ilab-journal", "status", str(demo_run), "--json").stdout)
    if status["state"] == "stopped" and status["stop_source"] == "eval":
        assert status["stopped_by"] == "eval:eval_accuracy.py"
        operator = cli("ilab-journal", "check", str(demo_run), "-e", "stop_source == operator")
        assert operator.returncode == 1 and "stop_source = eval" in operator.stdout


@pytest.mark.extended
def test_a_backtest_of_the_demo_reproduces_its_stop(demo_run: Path) -> None:
    status = json.loads(cli("ilab-journal", "status", str(demo_run), "--json").stdout)
    assert status["state"] == "stopped", status  # the demo reaches its target (or stops early)
    real_stop = status["last_step"]
    # the policy that really stopped it, with the demo's own settings (examples/demo.py)
    policy = {
        "eval": ["--target", "accuracy>=0.8"],
        "early_stopping": ["--early-stopping", "metric=val_loss,patience=5,min_delta=0.001"],
    }[status["stop_source"]]
    proc = cli("ilab-journal", "backtest", str(demo_run), *policy, "--json")
    assert proc.returncode == 0, proc.stderr
    stop = json.loads(proc.stdout)["stops"][0]
    assert stop["trigger_step"] is not None and stop["trigger_step"] < real_stop
    # where the run stopped: the eval sends its stop, then its report at once; both reach
    # the trainer at one step boundary unless one falls between the two (docs/cli.md)
    assert stop["stop_step"] is not None and 0 <= real_stop - stop["stop_step"] <= 1, stop
    if status["stop_source"] == "eval":  # the checkpoint whose eval asked: the first >= 0.8
        reports = cli("ilab-journal", "show", str(demo_run), "-e", "report", "--json").stdout
        accs = [json.loads(line)["data"] for line in reports.splitlines()]
        first = min(r["step"] for r in accs if r["metrics"].get("accuracy", 0) >= 0.8)
        assert stop["trigger_step"] == first


@pytest.mark.extended
def test_patience_1_stops_earlier_and_says_what_it_costs(demo_run: Path) -> None:
    status = json.loads(cli("ilab-journal", "status", str(demo_run), "--json").stdout)
    proc = cli("ilab-journal", "backtest", str(demo_run), "--early-stopping",
               "metric=val_loss,patience=1", "--json")  # fmt: skip
    stop = json.loads(proc.stdout)["stops"][0]
    assert stop["stop_step"] is not None and stop["stop_step"] < status["last_step"]
    assert stop["steps_saved"] == status["last_step"] - stop["stop_step"]
    assert stop["metric"] == "accuracy:max" and stop["lost"] is not None and stop["lost"] >= 0
    table = cli(
        "ilab-journal", "backtest", str(demo_run), "--early-stopping", "metric=val_loss,patience=1"
    )
    assert f"would stop at step {stop['stop_step']}" in table.stdout
