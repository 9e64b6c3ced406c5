"""Ray jobs as a scheduler on a real local Ray head (tests/ray_cluster.py, one per module):
the scheduler interface through Ray's job submission API, ``ilab-watch --via ray`` (job
ids in the journal, retries, timeout), and kill -9 of the watcher while its jobs pend."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import textwrap
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import BIN, cli, make_checkpoint, pythonpath, records, wait_for, write_run
from watcher.scheduler import JobSpec
from watcher.scheduler.board import JobBoard
from watcher.scheduler.markers import load

EVAL = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path
    ck = Path(os.environ["ILAB_CHECKPOINT_PATH"])
    time.sleep(float(os.environ.get("EVAL_SECONDS", "0.5")))
    assert ck.is_dir(), f"{ck} was removed while its job ran"
    print("evaluated", ck)
    with open(os.environ["ILAB_REPORT"], "w") as f:
        json.dump({"accuracy": int(os.environ["ILAB_STEP"]) / 100}, f)
    """
)


def test_ray_options_are_one_line_usage_errors(tmp_path: Path) -> None:
    """No Ray needed: --ray-* without --via ray, no address, an unreachable head."""
    from watcher.scheduler.ray_jobs import parse_resources

    assert parse_resources("num_gpus=1,num_cpus=0.5,memory=2e9,accel=2") == {
        "entrypoint_num_gpus": 1.0,
        "entrypoint_num_cpus": 0.5,
        "entrypoint_memory": 2_000_000_000,
        "entrypoint_resources": {"accel": 2.0},
    }
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    has_ray = importlib.util.find_spec("ray") is not None
    unreachable = "cannot reach Ray at" if has_ray else "Ray's job client cannot be imported"
    for extra, says in [
        (("--ray-address", "http://h:8265"), "--ray-address need(s) --via ray"),
        (("--via", "ray"), "--via ray needs --ray-address URL or $RAY_ADDRESS"),
        (("--via", "ray", "--ray-address", "h:1", "--ray-resources", "gpu"), "'gpu' is not"),
        (("--via", "ray", "--job-env", "RAY_ADDRESS"), "RAY_* variables are Ray's own"),
        # amounts that are not finite: refused at start, not an OverflowError or a failed submit
        (("--via", "ray", "--ray-address", "h:1", "--ray-resources", "memory=inf"), "memory=inf"),
        (("--via", "ray", "--ray-address", "h:1", "--ray-resources", "num_gpus=nan"), "num_gpus"),
        # where Ray is not installed (PYTHON_ENV=system), that is the one line instead
        (("--via", "ray", "--ray-address", "http://127.0.0.1:9"), unreachable),
    ]:
        out = cli("ilab-watch", str(tmp_path), "--on-save", "true", *extra, env=env)
        assert out.returncode == 2, out.stderr
        assert says in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr


# -- on a real Ray head (extended: starting one takes ~30 s on 2 cores) ---------------------


def _saved_run(tmp_path: Path, saves: int) -> Path:
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    w = write_run(ckpt, steps=5 * saves, save_every=5)
    for s in range(1, saves + 1):
        make_checkpoint(ckpt, 5 * s, w.run_id)
    return ckpt


def _results(ckpt: Path, name: str) -> list[dict[str, Any]]:
    path = ckpt / "watch" / f"{name}.results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _noted(jobs_dir: Path) -> list[str]:
    """The job ids noted in the job markers of ``jobs_dir`` (written after each submit)."""
    markers = [load(p) for p in jobs_dir.glob("*.json")]
    return [m["job_id"] for m in markers if m is not None and m.get("job_id")]


def _env(head: Any, **extra: str) -> dict[str, str]:
    return {"RAY_ADDRESS": head.address, "PYTHONPATH": pythonpath(), **extra}


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_scheduler_interface_on_real_ray(ray_head: Any, tmp_path: Path) -> None:
    """submit, the states of many jobs in ONE list_jobs call per poll, an exit code, find
    by name, stop; ids Ray does not know are left out."""
    from watcher.scheduler.ray_jobs import RayScheduler

    sched = RayScheduler(ray_head.address)
    ids = []
    for i, body in enumerate(["exit 3", "sleep 60", "sleep 60"]):
        script = tmp_path / f"j{i}.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        spec = JobSpec(f"iface-{i}", script, dict(os.environ), tmp_path / f"j{i}.log", tmp_path)
        ids.append(sched.submit(spec))
    assert len(set(ids)) == 3 and sched.find("iface-2") == ids[2]
    calls_before = sched.calls
    board = JobBoard(sched, poll_s=0.2)
    for j in ids:
        board.watch(j)
    wait_for(lambda: board.polls >= 3, 30, "3 polls")
    board.close()
    assert sched.calls - calls_before == board.polls  # one call per poll for the 3 jobs

    def state(i: int) -> Any:
        return sched.states(ids).get(ids[i])

    wait_for(lambda: state(0) is not None and state(0).final, 60, "the failing job's end")
    assert (state(0).state, state(0).exit_code) == ("FAILED", 3)
    wait_for(lambda: all(state(i).state == "RUNNING" for i in (1, 2)), 60, "running jobs")
    sched.cancel(ids[1:])
    wait_for(lambda: all(state(i).state == "CANCELLED" for i in (1, 2)), 60, "stopped jobs")
    assert set(sched.states([*ids, "no-such-job"])) == set(ids)


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_watch_via_ray_journals_jobs_retries_and_times_out(ray_head: Any, tmp_path: Path) -> None:
    """--via ray on two saves: one job per checkpoint, its id, state and exit journaled and
    in the results, its report journaled; a failing hook retried (a job per attempt); a
    job past --timeout stopped."""
    ckpt = _saved_run(tmp_path, 2)
    script = tmp_path / "eval.py"
    script.write_text(EVAL)
    common = ("--via", "ray", "--job-poll", "0.3", "--replay", "--concurrency", "2")
    ok = cli(
        "ilab-watch",
        str(ckpt),
        "--on-save",
        str(script),
        "--name",
        "eval",
        *common,
        env=_env(ray_head),
        timeout=300,
    )
    assert ok.returncode == 0, ok.stderr
    recs = records(ckpt)
    saves = sorted(r["data"]["checkpoint_path"] for r in recs if r["event"] == "save")
    good = _results(ckpt, "eval")
    assert [r["status"] for r in good] == ["ok", "ok"]
    ended = [r["data"] for r in recs if r["event"] == "job" and r["data"]["state"] == "COMPLETED"]
    assert sorted(d["checkpoint_path"] for d in ended) == saves
    assert {d["job_id"] for d in ended} == {r["jobs"][0]["id"] for r in good}
    assert all(d["scheduler"] == "ray" and d["exit_code"] == 0 for d in ended)
    assert sorted(r["data"]["checkpoint_path"] for r in recs if r["event"] == "report") == saves
    fail = tmp_path / "fail.sh"
    fail.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fail.chmod(0o755)
    bad = cli(
        "ilab-watch",
        str(ckpt),
        "--on-save",
        str(fail),
        "--name",
        "bad",
        "--retries",
        "1",
        "--backoff",
        "0.1",
        *common,
        env=_env(ray_head),
        timeout=300,
    )
    assert bad.returncode == 1 and "exit code 3" in bad.stderr, bad.stderr
    failed = _results(ckpt, "bad")
    assert [(r["status"], r["attempts"]) for r in failed] == [("failed", 2)] * 2
    assert all(len({j["id"] for j in r["jobs"]}) == 2 for r in failed)  # a job per attempt
    slow = tmp_path / "slow.sh"
    slow.write_text("#!/bin/sh\nsleep 120\n")
    slow.chmod(0o755)
    late = cli(
        "ilab-watch",
        str(ckpt),
        "--on-save",
        str(slow),
        "--name",
        "late",
        "--timeout",
        "2",
        *common,
        env=_env(ray_head),
        timeout=300,
    )
    assert late.returncode == 1, late.stderr
    assert [r["status"] for r in _results(ckpt, "late")] == ["timeout", "timeout"]
    stopped = [r["data"] for r in records(ckpt) if r["event"] == "job"]
    assert sum(d["state"] == "CANCELLED" for d in stopped) == 2  # the jobs were stopped
    assert not list((ckpt / "leases").glob("*.json"))


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_watcher_killed_while_ray_jobs_pend_reattaches(ray_head: Any, tmp_path: Path) -> None:
    """kill -9 of the watcher while its 3 jobs are PENDING (a job holding the head's only
    CPU keeps them waiting for theirs), then a restart: still one Ray job per checkpoint,
    every result recorded."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_head.address)
    blocker = client.submit_job(entrypoint="sleep 300", entrypoint_num_cpus=1)
    ckpt = _saved_run(tmp_path, 3)
    script = tmp_path / "eval.py"
    script.write_text(EVAL)
    argv = [str(ckpt), "--on-save", str(script), "--name", "eval", "--concurrency", "3"]
    argv += ["--via", "ray", "--ray-resources", "num_cpus=1", "--job-poll", "0.3"]
    env = {**os.environ, **_env(ray_head)}
    first = subprocess.Popen([str(BIN / "ilab-watch"), *argv], env=env, stderr=subprocess.PIPE)
    try:

        def pending() -> bool:
            recs = [r for r in records(ckpt) if r["event"] == "job"]
            return len({r["data"]["checkpoint_path"] for r in recs}) == 3

        wait_for(pending, 120, "a pending job per checkpoint in the journal")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        client.stop_job(blocker)
    again = cli("ilab-watch", *argv, "--replay", env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    recs = records(ckpt)
    saves = sorted(r["data"]["checkpoint_path"] for r in recs if r["event"] == "save")
    ours = [j for j in client.list_jobs() if (j.metadata or {}).get("ilab_name")]
    ours = [j for j in ours if j.runtime_env and str(ckpt) in json.dumps(j.runtime_env)]
    assert len(ours) == 3, [j.submission_id for j in ours]  # no second job was submitted
    results = _results(ckpt, "eval")
    assert [r["status"] for r in results] == ["ok"] * 3
    assert all(r["jobs"][0]["adopted"] for r in results)
    assert sorted(r["data"]["checkpoint_path"] for r in recs if r["event"] == "report") == saves


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_a_job_ray_forgot_is_recorded_from_its_exit_file(ray_head: Any, tmp_path: Path) -> None:
    """A head restarted without fault tolerance forgets every job: kill -9 of the watcher
    while its job runs, the job ends, Ray's record of it is deleted; the restarted watcher
    takes the job's end from its exit file (exit code, report) and submits no second job."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(ray_head.address)
    ckpt = _saved_run(tmp_path, 1)
    go = tmp_path / "go"
    script = tmp_path / "eval.sh"
    script.write_text(
        f"#!/bin/sh\necho started >> {tmp_path}/starts\n"
        f"while [ ! -e {go} ]; do sleep 0.05; done\n"
        'echo \'{"accuracy": 0.5}\' > "$ILAB_REPORT"\n'
    )
    script.chmod(0o755)
    argv = [str(ckpt), "--on-save", str(script), "--name", "j", "--via", "ray"]
    argv += ["--job-poll", "0.3", "--replay"]
    env = {**os.environ, **_env(ray_head)}
    first = subprocess.Popen([str(BIN / "ilab-watch"), *argv], env=env, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "starts").exists(), 120, "the job's start")
        wait_for(lambda: _noted(ckpt / "watch" / "j.jobs"), 30, "the job's id in its marker")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    (job_id,) = _noted(ckpt / "watch" / "j.jobs")
    go.touch()
    wait_for(lambda: client.get_job_status(job_id).is_terminal(), 120, "the end")
    assert client.delete_job(job_id)  # Ray forgets it, as a restarted head would
    again = cli("ilab-watch", *argv, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    (res,) = _results(ckpt, "j")
    assert (res["status"], res["exit_code"], res["jobs"][0]["adopted"]) == ("ok", 0, True)
    assert (tmp_path / "starts").read_text().split() == ["started"]  # one job, not two
    assert [r["data"]["metrics"] for r in records(ckpt) if r["event"] == "report"] == [
        {"accuracy": 0.5}
    ]


@pytest.mark.extended
@pytest.mark.timeout(900)
def test_a_ray_job_shows_no_secret_of_the_watcher_on_the_dashboard(
    ray_head: Any, tmp_path: Path
) -> None:
    """A watcher whose environment holds AWS, HF and W&B secrets runs a job on the real
    head: the dashboard's GET /api/jobs/ (what anyone who reaches it reads) and the job's
    own environment hold none of them, but the --job-env name and ILAB_* (before: every
    variable but RAY_* went into the job's runtime_env)."""
    secrets = {
        "AWS_SECRET_ACCESS_KEY": "aws-secret-4f1d9c",
        "HF_TOKEN": "hf_token_7b2e0a",
        "WANDB_API_KEY": "wandb-key-91c3e5",
    }
    ckpt = _saved_run(tmp_path, 1)
    script = tmp_path / "print_env.sh"
    script.write_text("#!/bin/sh\nenv\n")
    script.chmod(0o755)
    done = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", str(script), "--name", "env", "--via", "ray", "--job-poll", "0.3"),
        *("--replay", "--job-env", "EVAL_EXTRA"),
        env=_env(ray_head, **secrets, EVAL_EXTRA="named-extra-5e8a"),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    with urllib.request.urlopen(f"{ray_head.address}/api/jobs/", timeout=30) as resp:
        body = resp.read().decode()
    ours = [j for j in json.loads(body) if str(ckpt) in json.dumps(j.get("runtime_env"))]
    (job,) = ours
    env_vars = job["runtime_env"]["env_vars"]
    assert env_vars["EVAL_EXTRA"] == "named-extra-5e8a" and env_vars["ILAB_STEP"] == "5"
    assert not [v for v in secrets.values() if v in body]
    (res,) = _results(ckpt, "env")
    seen = Path(res["log_path"]).read_text()
    assert "EVAL_EXTRA=named-extra-5e8a" in seen
    assert not [v for v in secrets.values() if v in seen]
