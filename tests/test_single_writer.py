"""One writer, no orphans: a busy checkpoint dir refuses a second launch, workers end with
their launcher, a relaunch never trains beside leftovers, a restarted watcher never runs a
delivery beside a leftover copy of itself, and ranks that disagree on the run stop."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.helpers import (
    BIN,
    cli,
    free_port,
    max_step,
    pythonpath,
    records,
    relaunch_after_killing_the_launcher,
    still_running,
    train,
    train_argv,
    train_env,
    wait_for,
)

pytestmark = pytest.mark.dist


@pytest.mark.extended  # 30 s of a 2-rank run: the default suite keeps its margin under 10 min
def test_a_second_launch_on_a_busy_dir_is_refused_with_exit_3(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "300"),
        env=train_env(step_delay=0.2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: max_step(ckpt) >= 2, what="step 2")
        run_id = records(ckpt)[0]["run_id"]
        second = train(ckpt, "--max-steps", "5", timeout=60)
        assert second.returncode == 3, second.stderr
        line = second.stderr.strip()
        assert len(line.splitlines()) == 1 and "Traceback" not in line
        assert f"pid {job.pid}" in line and f"run {run_id}" in line and "in use by" in line
        status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
        assert status["holder"]["pid"] == job.pid and status["holder"]["role"] == "launcher"
        cli("ilab-journal", "control", "stop", str(ckpt))
        _, err = job.communicate(timeout=120)
    finally:
        job.kill()
    assert job.returncode == 0, err[-2000:]
    begins = [r for r in records(ckpt) if r["event"] == "train_begin"]
    assert len(begins) == 1  # the refused launch wrote nothing
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["holder"] is None  # released at the end


@pytest.mark.extended
def test_killing_the_launcher_leaves_no_orphans_and_a_relaunch_completes(
    tmp_path: Path, reliability: Any
) -> None:
    figures = relaunch_after_killing_the_launcher(tmp_path, kills=1)  # make torture: 10
    assert figures["orphans_gone_max_s"] < 30
    reliability("kill -9 launcher only + immediate relaunch (bounded)", **figures)


SLOW_CALLBACK = textwrap.dedent(
    """
    import json, os, sys, time
    log = os.environ["CALLS"]
    with open(log, "a") as f:
        f.write(json.dumps({"id": os.environ["ILAB_DELIVERY_ID"], "pid": os.getpid(),
                            "at": "start", "t": time.time()}) + "\\n")
    time.sleep(float(os.environ.get("SLEEP", "3")))
    with open(log, "a") as f:
        f.write(json.dumps({"id": os.environ["ILAB_DELIVERY_ID"], "pid": os.getpid(),
                            "at": "end", "t": time.time()}) + "\\n")
    """
)


def test_a_watcher_killed_mid_delivery_leaves_no_callback_running(
    tmp_path: Path, ckpt: Path
) -> None:
    from tests.helpers import write_run

    write_run(ckpt, steps=4, save_every=2)  # two saves, then train_end
    script, calls = tmp_path / "cb.py", tmp_path / "calls.jsonl"
    script.write_text(SLOW_CALLBACK)
    env = {**os.environ, "CALLS": str(calls), "SLEEP": "3"}
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(script), "--name", "w"]
    first = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    entries = wait_for(
        lambda: calls.exists() and [json.loads(x) for x in calls.read_text().splitlines()],
        what="a delivery started",
    )
    child = psutil.Process(entries[0]["pid"])
    first.send_signal(signal.SIGKILL)
    first.wait()
    child.wait(timeout=10)  # ended with its watcher, not left running
    second = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert second.returncode == 0, second.stderr
    log = [json.loads(x) for x in calls.read_text().splitlines()]
    ends = {e["id"] for e in log if e["at"] == "end"}
    assert len(ends) == 2  # both saves delivered to the end
    spans: dict[str, list[tuple[float, float]]] = {}
    starts = {(e["id"], e["pid"]): e["t"] for e in log if e["at"] == "start"}
    for e in log:
        if e["at"] == "end":
            spans.setdefault(e["id"], []).append((starts[(e["id"], e["pid"])], e["t"]))
    assert all(len(v) == 1 for v in spans.values())  # the killed run never finished


@pytest.mark.extended
def test_nodes_given_different_checkpoint_dirs_stop_with_one_clear_error(
    tmp_path: Path,
) -> None:
    port = str(free_port())
    dirs = [tmp_path / "node0", tmp_path / "node1"]
    procs = [
        subprocess.Popen(
            [
                *(str(BIN / "ilab-train"), "--demo", "--ckpt-dir", str(d), "--max-steps", "3"),
                *("--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1"),
                *("--master-addr", "127.0.0.1", "--master-port", port, "--quiet"),
            ],
            env=train_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, d in enumerate(dirs)
    ]
    try:
        errs = [p.communicate(timeout=180)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 1 for p in procs), errs
    end = records(dirs[0])[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert "ranks disagree on the checkpoint dir" in end["data"]["reason"]
    assert str(dirs[1]) in end["data"]["reason"]
    assert "ranks disagree" in errs[0]


@pytest.mark.extended
def test_two_concurrent_launches_on_one_dir_train_once(tmp_path: Path, reliability: Any) -> None:
    ckpt = tmp_path / "run"
    procs = [
        subprocess.Popen(
            train_argv(ckpt, "--max-steps", "6"),
            env=train_env(),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        errs = [p.communicate(timeout=240)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    codes = sorted(p.returncode for p in procs)
    assert codes == [0, 3], errs
    assert len([r for r in records(ckpt) if r["event"] == "train_begin"]) == 1
    assert cli("ilab-journal", "validate", str(ckpt)).returncode == 0
    reliability("two concurrent launches on one dir", exit_codes=codes, trained=1)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_control_command_applies_on_both_nodes_at_the_same_step(
    tmp_path: Path, reliability: Any
) -> None:
    """Two nodes (2 launchers, one rank each) on loopback, one shared checkpoint dir."""
    ckpt = tmp_path / "run"
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [
                *train_argv(ckpt, "--max-steps", "300", "--log-every", "1000"),
                *("--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1"),
                *("--master-addr", "127.0.0.1", "--master-port", port),
            ],
            env=train_env(step_delay=0.1),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    try:
        wait_for(lambda: max_step(ckpt) >= 3, what="step 3")
        assert [r["data"]["nnodes"] for r in records(ckpt) if r["event"] == "train_begin"] == [2]
        cid = cli("ilab-journal", "control", "stop", str(ckpt), "--reason", "two nodes").stdout
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], errs
    rec = next(r for r in records(ckpt) if r["event"] == "control")
    assert rec["data"]["id"] == cid.strip() and rec["data"]["accepted"]
    step = rec["data"]["applied_at_step"]
    logs = [(ckpt / "logs" / f"rank-{r}.log").read_text() for r in (0, 1)]
    for text in logs:  # each node's rank logs the command at the same step
        assert f"control stop applied at step {step}" in text
    assert records(ckpt)[-1]["data"]["status"] == "stopped" and records(ckpt)[-1]["step"] == step
    reliability("2 nodes on loopback: stop applied on both", applied_at_step=step, nodes=2)


def test_an_agent_that_hangs_after_its_launcher_died_is_ended(tmp_path: Path) -> None:
    """torchrun can miss its own SIGTERM shutdown (its handler's exception landed inside
    ``Popen.poll``, and it never reaps its workers again): the agent must still end. Here a
    stand-in for torchrun ignores SIGTERM, starts a worker and never waits for it."""
    agent_pid = tmp_path / "agent.pid"
    stand_in = textwrap.dedent(
        f"""
        import os, signal, subprocess, sys, time
        from pathlib import Path
        from trainer.launch.agent import main

        def hung_torchrun():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            subprocess.Popen([sys.executable, "-c", "pass"])  # ends, never reaped
            Path({str(agent_pid)!r}).write_text(str(os.getpid()))
            while True:
                time.sleep(1)

        main(hung_torchrun)
        """
    )
    launcher_code = textwrap.dedent(
        f"""
        import os, subprocess, sys, time
        from journal.rundir.procs import die_with_parent
        env = {{**os.environ, "ILAB_LAUNCHER_PID": str(os.getpid())}}
        subprocess.Popen([sys.executable, "-c", {stand_in!r}], env=env,
                         preexec_fn=die_with_parent)
        time.sleep(600)
        """
    )
    env = {**train_env(), "PYTHONPATH": pythonpath()}
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], env=env)
    try:
        pid = wait_for(lambda: agent_pid.exists() and agent_pid.read_text(), what="agent")
        agent = psutil.Process(int(pid))
    finally:
        launcher.kill()
        launcher.wait()
    try:
        assert not still_running([agent], timeout=30), "the agent outlived its launcher"
    finally:
        with contextlib.suppress(psutil.NoSuchProcess):
            agent.kill()
