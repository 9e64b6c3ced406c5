"""``ilab-watch --via local`` killed with ``kill -9`` between starting a job and noting its
id (issue "Hardening 4"): the restarted watcher adopts the job its predecessor started,
running or ended, and never runs the checkpoint's command a second time; a job whose
watcher died before its id was recorded never runs its command at all."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from journal.rundir.procs import start_time
from tests.helpers import BIN, cli, make_checkpoint, pythonpath, records, wait_for, write_run


def _saved_run(tmp_path: Path) -> Path:
    """A run dir with one save (step 5) and its checkpoint."""
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    w = write_run(ckpt, steps=5, save_every=5)
    make_checkpoint(ckpt, 5, w.run_id)
    return ckpt


def _gated_job(tmp_path: Path) -> Path:
    """A command that notes each start in ``starts``, waits for ``go``, then reports."""
    job = tmp_path / "job.sh"
    job.write_text(
        f"#!/bin/sh\necho started >> {tmp_path}/starts\n"
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"
        'printf \'{"accuracy": 0.5}\' > "$ILAB_REPORT"\necho done\n'
    )
    job.chmod(0o755)
    return job


def _marker(ckpt: Path) -> Path | None:
    """The watcher's one job marker (watch/j.jobs/<delivery>.json), once written."""
    jobs = ckpt / "watch" / "j.jobs"
    found = [p for p in jobs.glob("*.json") if not p.name.endswith((".event.json", ".report.json"))]
    return found[0] if found else None


def _load(path: Path) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(path.read_text())
    return obj


def _results(ckpt: Path) -> list[dict[str, Any]]:
    path = ckpt / "watch" / "j.results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("job_state", ["running", "ended"])
def test_a_watcher_killed_before_noting_its_local_job_runs_the_command_once(
    tmp_path: Path, job_state: str
) -> None:
    """kill -9 of ``ilab-watch --via local`` once its job's command started, its marker as a
    kill between starting the job and noting its id leaves it (no ``job_id``): the
    restarted watcher adopts that job, still running or already ended, instead of
    submitting attempt 2 (whose script would run the command again), and records its
    result once. Failed before the fix: ``starts`` had two lines, the result two jobs."""
    ckpt = _saved_run(tmp_path)
    job = _gated_job(tmp_path)
    argv = [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(job), "--name", "j"]
    argv += ["--via", "local", "--replay", "--job-poll", "0.2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    first = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "starts").exists(), 60, "the job's command started")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    marker_path = wait_for(lambda: _marker(ckpt), 5, "the job's marker")
    marker = _load(marker_path)
    # what a kill between starting the job and noting its id leaves: the marker written
    # before submitting (its name, prefix and attempt), no id
    marker.update(job_id=None)
    marker.pop("submitted_at", None)
    marker_path.write_text(json.dumps(marker))
    exit_file = Path(marker["prefix"]).with_suffix(".exit")
    if job_state == "ended":
        (tmp_path / "go").touch()
        wait_for(exit_file.exists, 30, "the job's exit file")
        again = cli("ilab-watch", *argv[1:], env={"PYTHONPATH": pythonpath()})
        assert again.returncode == 0, again.stderr
    else:
        second = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            # the restarted watcher took the delivery over (owner changed) and knows its job
            def taken_over() -> bool:
                now = _load(marker_path)
                return now["owner"] != marker["owner"] and now.get("job_id") is not None

            wait_for(taken_over, 60, "the restarted watcher's job")
            (tmp_path / "go").touch()
            _, err = second.communicate(timeout=60)
        finally:
            second.kill()
        assert second.returncode == 0, err
    assert (tmp_path / "starts").read_text().split() == ["started"]  # the command ran once
    (res,) = _results(ckpt)
    assert res["status"] == "ok" and "done" in res["stdout_tail"]
    assert [j["adopted"] for j in res["jobs"]] == [True]  # the first watcher's job, no other
    reports = [r for r in records(ckpt) if r["event"] == "report"]
    assert len(reports) == 1  # its report, submitted once
    assert not list(exit_file.parent.glob("*-a1.*"))  # the job's files, record too, are gone


#: A watcher that starts a local job and dies (kill -9) before it could record the job's
#: id: the first half of LocalScheduler.submit, then the end a kill gives.
_DIES_BEFORE_RECORDING = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from watcher.scheduler import JobSpec
    from watcher.scheduler.local import LocalScheduler
    script, log = Path(sys.argv[1]), Path(sys.argv[2])
    spec = JobSpec("ilab-test-a1", script, dict(os.environ), log, script.parent)
    proc = LocalScheduler().start_gated(spec)
    print(proc.pid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_local_job_whose_watcher_died_before_recording_it_never_runs(tmp_path: Path) -> None:
    """The gate of a local job: a watcher killed after starting the job's process and
    before recording its id leaves a job that ends without running its command (a
    restarted watcher, which cannot find it, submits the delivery again: the command
    still runs once)."""
    script = tmp_path / "d-a1.sh"
    script.write_text(f"#!/bin/sh\necho ran > {tmp_path}/ran\n")
    out = subprocess.run(
        [sys.executable, "-c", _DIES_BEFORE_RECORDING, str(script), str(tmp_path / "log")],
        env={**os.environ, "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == -signal.SIGKILL, out.stderr
    pid = int(out.stdout.split()[0])

    def ended() -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            return True
        return state in ("Z", "X") or start_time(pid) is None

    wait_for(ended, 30, "the job's end")
    assert not (tmp_path / "ran").exists()
    assert not script.with_suffix(".job").exists()


def test_a_job_env_name_not_set_here_is_said_and_the_set_one_reaches_the_job(
    tmp_path: Path,
) -> None:
    """``--job-env NAME`` sends the watcher's value: a name this environment does not hold
    (a typo, a variable exported in another shell) is one warning, not silently nothing."""
    ckpt = _saved_run(tmp_path)
    seen = tmp_path / "seen"
    env = {"ILAB_TEST_SET": "yes"}
    proc = cli("ilab-watch", str(ckpt), "--replay", "--via", "local", "--job-poll", "0.2",
               "--job-env", "ILAB_TEST_UNSET_XYZ", "--job-env", "ILAB_TEST_SET",
               "--on-save", f"sh -c 'echo \"$ILAB_TEST_SET\" > {seen}'", env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = [x for x in proc.stderr.splitlines() if "ILAB_TEST_UNSET_XYZ" in x]
    assert len(said) == 1 and "not set in this environment" in said[0]
    assert "--job-env ILAB_TEST_SET:" not in proc.stderr
    assert seen.read_text().strip() == "yes"
