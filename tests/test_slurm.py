"""Scheduler jobs on a real one-node Slurm (tests/slurm_cluster.py): the scheduler
interface, ``ilab-watch --via slurm`` (job ids in the journal, retries, kill -9 and
re-attach), training with 2 ranks beside it, and ``ilab-train`` inside ``sbatch``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import IO, Any

import pytest

from tests.helpers import (
    BIN,
    cli,
    make_checkpoint,
    pythonpath,
    records,
    train,
    wait_for,
    write_run,
)
from tests.slurm_cluster import SlurmCluster
from watcher.scheduler import JobSpec
from watcher.scheduler.board import JobBoard
from watcher.scheduler.slurm import SlurmScheduler

EVAL = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path
    ck = Path(os.environ["ILAB_CHECKPOINT_PATH"])
    assert ck.is_dir(), f"{ck} is gone at the start"
    time.sleep(float(os.environ.get("EVAL_SECONDS", "2")))
    assert ck.is_dir(), f"{ck} was removed while its job ran"
    step = int(os.environ["ILAB_STEP"])
    print("evaluated", ck, "in job", os.environ.get("SLURM_JOB_ID"))
    with open(os.environ["ILAB_REPORT"], "w") as f:
        json.dump({"accuracy": 1.0 if step == BEST else step / 1000}, f)
    """
)


def _env(slurm: SlurmCluster, **extra: str) -> dict[str, str]:
    return {"SLURM_CONF": str(slurm.conf), "PYTHONPATH": pythonpath(), **extra}


def _results(ckpt: Path, name: str) -> list[dict[str, Any]]:
    path = ckpt / "watch" / f"{name}.results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()]


def _jobs_by_checkpoint(recs: list[dict[str, Any]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in recs:
        if r["event"] == "job":
            out.setdefault(r["data"]["checkpoint_path"], set()).add(r["data"]["job_id"])
    return out


def _squeue_all(slurm: SlurmCluster) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i|%j"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.split()


def _saved_run(tmp_path: Path, saves: int = 2) -> Path:
    ckpt = tmp_path / "run"
    ckpt.mkdir()
    w = write_run(ckpt, steps=5 * saves, save_every=5)
    for s in range(1, saves + 1):
        make_checkpoint(ckpt, 5 * s, w.run_id)
    return ckpt


def test_scheduler_interface_on_real_slurm(
    slurm: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit (sbatch --parsable), the states of many jobs in one squeue, cancel; a job
    found again by its name; a JobBoard polls 4 jobs with one query per poll."""
    monkeypatch.setenv("SLURM_CONF", str(slurm.conf))
    sched = SlurmScheduler("-c1")
    ids = []
    for i, body in enumerate(["exit 3", "sleep 60", "sleep 60", "sleep 60"]):
        script = tmp_path / f"j{i}.sh"
        script.write_text(f"#!/bin/sh\n{body}\n")
        spec = JobSpec(f"iface-{i}", script, dict(os.environ), tmp_path / f"j{i}.log", tmp_path)
        ids.append(sched.submit(spec))
    assert all(i.isdigit() for i in ids) and len(set(ids)) == 4
    assert sched.find("iface-2") == ids[2]
    calls_before = sched.calls
    board = JobBoard(sched, poll_s=0.2)
    for j in ids:
        board.watch(j)
    wait_for(lambda: board.polls >= 3, 30, "3 polls")
    board.close()
    assert sched.calls - calls_before == board.polls  # one query per poll for the 4 jobs

    def state(i: int) -> str | None:
        st = sched.states(ids).get(ids[i])
        return st.state if st else None

    wait_for(lambda: state(0) == "FAILED", 30, "the failing job's end")
    sched.cancel(ids[1:])
    wait_for(lambda: all(state(i) == "CANCELLED" for i in (1, 2, 3)), 30, "cancelled jobs")
    assert set(sched.states([*ids, "999999"])) == set(ids)  # an unknown id is left out


def test_watch_via_slurm_journals_jobs_and_retries_failures(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """--via slurm on two saves: each checkpoint evaluated by one job whose id, node and
    end are in the journal and in the results, its report journaled; a failing hook's job
    gives a failed delivery, retried per --retries (one job per attempt)."""
    ckpt = _saved_run(tmp_path)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 10\n" + EVAL)
    fail = tmp_path / "fail.sh"
    fail.write_text("#!/bin/sh\necho broken >&2\nexit 3\n")
    fail.chmod(0o755)
    common: tuple[str, ...] = ("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3")
    common += ("--replay",)
    common += ("--concurrency", "2")  # both saves' jobs at once
    common += ("--job-env", "EVAL_SECONDS")  # a job gets only what is named (and ILAB_*)
    ok = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", str(script), "--name", "eval", *common),
        env=_env(slurm, EVAL_SECONDS="0.5"),
        timeout=120,
    )
    assert ok.returncode == 0, ok.stderr
    bad = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", str(fail), "--name", "bad", "--retries", "1", "--backoff", "0.1"),
        *common,
        env=_env(slurm),
        timeout=120,
    )
    assert bad.returncode == 1, bad.stderr
    assert "exit code 3" in bad.stderr and ": broken" in bad.stderr  # the log's last line
    recs = records(ckpt)
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    good = [r for r in _results(ckpt, "eval")]
    assert [r["status"] for r in good] == ["ok", "ok"]
    for r in good:
        (job,) = r["jobs"]
        assert job["scheduler"] == "slurm" and job["node"] == slurm.node
        assert [s["state"] for s in job["states"]][-1] == "COMPLETED"
        assert f"in job {job['id']}" in r["stdout_tail"]
    ended = [r["data"] for r in recs if r["event"] == "job" and r["data"]["state"] == "COMPLETED"]
    by_ckpt = {d["checkpoint_path"]: d["job_id"] for d in ended}
    assert sorted(by_ckpt) == sorted(saves)
    assert {j["id"] for r in good for j in r["jobs"]} == set(by_ckpt.values())
    assert all(d["exit_code"] == 0 and d["node"] == slurm.node for d in ended)
    reports = {r["data"]["checkpoint_path"] for r in recs if r["event"] == "report"}
    assert reports == set(saves)
    failed = _results(ckpt, "bad")
    assert [(r["status"], r["attempts"], r["exit_code"]) for r in failed] == [("failed", 2, 3)] * 2
    assert all(len({j["id"] for j in r["jobs"]}) == 2 for r in failed)  # a job per attempt
    assert all("broken" in r["stdout_tail"] for r in failed)
    assert not list((ckpt / "leases").glob("*.json"))
    assert not list((ckpt / "watch" / "eval.jobs").glob("*.json"))  # ended: markers gone
    status = cli("ilab-journal", "status", str(ckpt))  # job records after train_end:
    assert status.returncode == 0 and "completed" in status.stdout  # still completed, exit 0


def test_watch_via_local_runs_jobs_as_processes(tmp_path: Path) -> None:
    """--via local: the same delivery as a job of the local scheduler (no Slurm)."""
    ckpt = _saved_run(tmp_path, saves=1)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    done = cli(
        "ilab-watch",
        "run",  # relative: the job runs in the watcher's cwd, as a local command would
        *("--on-save", str(script), "--name", "local", "--via", "local", "--replay"),
        *("--job-poll", "0.2", "--job-env", "EVAL_SECONDS"),
        env={"EVAL_SECONDS": "0", "PYTHONPATH": pythonpath()},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    (res,) = _results(ckpt, "local")
    assert res["status"] == "ok" and res["jobs"][0]["scheduler"] == "local"
    (end,) = [r for r in records(ckpt) if r["event"] == "job" and r["data"]["state"] == "COMPLETED"]
    assert end["data"]["job_id"] == res["jobs"][0]["id"]
    assert any(r["event"] == "report" for r in records(ckpt))


def test_a_restarted_watcher_reattaches_to_its_local_job(tmp_path: Path) -> None:
    """--via local, kill -9 of the watcher while its job runs: the job (a process of its own
    session) runs on, the restarted watcher re-attaches to it instead of starting another,
    and records its result."""
    ckpt = _saved_run(tmp_path, saves=1)
    go = tmp_path / "go"
    job = tmp_path / "job.sh"
    job.write_text(
        f"#!/bin/sh\necho started >> {tmp_path}/starts\n"
        f"while [ ! -e {go} ]; do sleep 0.05; done\necho done\n"
    )
    job.chmod(0o755)
    argv = [str(ckpt), "--on-save", str(job), "--name", "j", "--via", "local", "--replay"]
    argv += ["--job-poll", "0.2"]
    first = subprocess.Popen([str(BIN / "ilab-watch"), *argv], stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (tmp_path / "starts").exists(), 30, "the job's start")
        # killed once the job's id is noted: before that, a local job cannot be found again
        wait_for(lambda: _job_id(ckpt, "j"), 30, "the job's id in the marker")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
    go.touch()
    again = cli("ilab-watch", *argv)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "starts").read_text().split() == ["started"]  # one job, not two
    (res,) = _results(ckpt, "j")
    assert res["status"] == "ok" and res["jobs"][0]["adopted"] and "done" in res["stdout_tail"]


def test_scheduler_options_are_usage_errors_without_via(tmp_path: Path) -> None:
    out = cli("ilab-watch", str(tmp_path), "--on-save", "true", "--sbatch-args", "-c1")
    assert out.returncode == 2 and "--sbatch-args and --cancel-on-abort need --via" in out.stderr
    assert "Traceback" not in out.stderr


#: The watcher's secrets (values unique enough to be searched for) that no job may get.
SECRETS = {
    "AWS_SECRET_ACCESS_KEY": "aws-secret-4f1d9c",
    "HF_TOKEN": "hf_token_7b2e0a",
    "WANDB_API_KEY": "wandb-key-91c3e5",
}
PRINT_ENV = "#!/bin/sh\nenv\n"


def test_a_job_gets_ilab_what_a_program_needs_and_named_variables_only() -> None:
    """The one rule of every scheduler's job environment (watcher/scheduler job_env):
    ILAB_*, PATH and the like, HF's offline switches, --job-env's names; no secret."""
    from watcher.scheduler import job_env

    env = {**SECRETS, "PATH": "/bin", "ILAB_STEP": "5", "LC_ALL": "C", "HF_HUB_OFFLINE": "1"}
    env |= {"MY_SETTING": "x", "RAY_ADDRESS": "http://h:1", "EXTRA": "y"}
    assert job_env(env, ["EXTRA", "NOT_SET"]) == {
        "PATH": "/bin",
        "ILAB_STEP": "5",
        "LC_ALL": "C",
        "HF_HUB_OFFLINE": "1",
        "EXTRA": "y",
    }


def test_job_env_takes_names_with_via_only(tmp_path: Path) -> None:
    """--job-env without --via, or with NAME=VALUE (a value would be on the command line
    for ps to show): one line, exit 2."""
    for extra, says in [
        ((), "--job-env needs --via"),
        (("--via", "local"), "--job-env 'HF_TOKEN=abc': not a variable name"),
    ]:
        arg = "HF_TOKEN=abc" if extra else "HF_TOKEN"
        out = cli("ilab-watch", str(tmp_path), "--on-save", "true", *extra, "--job-env", arg)
        assert out.returncode == 2, out.stderr
        assert says in out.stderr.strip().splitlines()[-1] and "Traceback" not in out.stderr


def _job_env_seen(ckpt: Path, via: tuple[str, ...], env: dict[str, str], tmp: Path) -> str:
    """What a job of ``ilab-watch ... --via ...`` printed of its environment (``env``: its
    watcher's additions, the secrets among them)."""
    script = tmp / "print_env.sh"
    script.write_text(PRINT_ENV)
    script.chmod(0o755)
    done = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", str(script), "--name", "env", "--replay", "--job-poll", "0.2", *via),
        *("--job-env", "EVAL_EXTRA"),
        env={**SECRETS, "EVAL_EXTRA": "named-extra-5e8a", **env},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    (res,) = _results(ckpt, "env")
    return Path(res["log_path"]).read_text()


def test_a_local_job_gets_no_secret_of_the_watcher(tmp_path: Path) -> None:
    """--via local rehearses a cluster's job: the same environment, no secret."""
    seen = _job_env_seen(_saved_run(tmp_path, saves=1), ("--via", "local"), {}, tmp_path)
    assert "EVAL_EXTRA=named-extra-5e8a" in seen and "ILAB_STEP=5" in seen
    assert not [v for v in SECRETS.values() if v in seen]


def test_a_slurm_job_gets_no_secret_of_the_watcher(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A real Slurm job of a watcher whose environment holds AWS, HF and W&B secrets: the
    job's environment (printed by the job) has none of them, and has ILAB_*, PATH and the
    --job-env name (before: sbatch --export=ALL gave it the watcher's whole environment)."""
    ckpt = _saved_run(tmp_path, saves=1)
    via = ("--via", "slurm", "--sbatch-args", "-c1")
    seen = _job_env_seen(ckpt, via, _env(slurm), tmp_path)
    assert "EVAL_EXTRA=named-extra-5e8a" in seen and "ILAB_STEP=5" in seen
    assert f"PATH={os.environ['PATH']}" in seen and "SLURM_JOB_ID=" in seen
    assert not [v for v in SECRETS.values() if v in seen]


@pytest.mark.extended
def test_watcher_killed_while_jobs_pend_reattaches(slurm: SlurmCluster, tmp_path: Path) -> None:
    """kill -9 of the watcher while its 3 jobs are pending (a job holding every CPU keeps
    them queued), then a restart: still one job per checkpoint, every result recorded."""
    ckpt = _saved_run(tmp_path, saves=3)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 10\n" + EVAL)
    blocker = subprocess.run(
        ["sbatch", "--parsable", f"-c{slurm.cpus}", "-o", "/dev/null", "--wrap", "sleep 300"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    argv = [
        str(BIN / "ilab-watch"),
        str(ckpt),
        *("--on-save", str(script), "--name", "eval", "--concurrency", "3"),
        *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3", "--lease-ttl", "30"),
        *("--job-env", "EVAL_SECONDS"),
    ]
    env = {**os.environ, **_env(slurm, EVAL_SECONDS="0.5")}
    before = set(_squeue_all(slurm))
    first = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:

        def pending() -> bool:
            recs = [r for r in records(ckpt) if r["event"] == "job"]
            return len({r["data"]["checkpoint_path"] for r in recs}) == 3

        wait_for(pending, 60, "a pending job per checkpoint in the journal")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
    again = cli("ilab-watch", *argv[1:], "--replay", env=env, timeout=180)
    assert again.returncode == 0, again.stderr
    recs = records(ckpt)
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    by_ckpt = _jobs_by_checkpoint(recs)
    assert sorted(by_ckpt) == sorted(saves) and all(len(v) == 1 for v in by_ckpt.values())
    ours = [line for line in set(_squeue_all(slurm)) - before if "|ilab-" in line]
    assert len(ours) == 3, ours  # no second job was submitted
    results = _results(ckpt, "eval")
    assert sorted(r["status"] for r in results) == ["ok"] * 3
    assert all(r["jobs"][0]["adopted"] for r in results)
    reports = [r for r in recs if r["event"] == "report"]
    assert sorted(r["data"]["checkpoint_path"] for r in reports) == sorted(saves)


def test_slurm_env_gives_nodes_rank_and_rendezvous() -> None:
    """Inside sbatch/srun: node count, node rank and a c10d endpoint on the first host of
    the node list; what the user gave wins; one node and no Slurm change nothing."""
    from trainer.launch.slurm_env import slurm_torchrun

    env = {
        "SLURM_JOB_ID": "41",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_NODEID": "2",
        "SLURM_JOB_NODELIST": "gpu[07-10]",
    }
    got = slurm_torchrun({"nproc_per_node": 8}, env)
    assert got == {
        "nproc_per_node": 8,
        "nnodes": 4,
        "node_rank": 2,
        "rdzv_id": "slurm-41",
        "rdzv_endpoint": "gpu07:29500",
    }
    assert slurm_torchrun({"nnodes": 2, "rdzv_endpoint": "h:1"}, env) == {
        "nnodes": 2,
        "rdzv_endpoint": "h:1",
    }
    assert slurm_torchrun({}, {**env, "SLURM_JOB_NUM_NODES": "1"}) == {}
    assert slurm_torchrun({}, {}) == {}


@pytest.mark.extended
@pytest.mark.dist
def test_eval_jobs_beside_two_rank_training_keep_their_checkpoints(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """The issue's acceptance: 2-rank ilab-train with --keep-last-n 1 --keep-best
    accuracy:max, each save's eval a Slurm job (2 s, reports accuracy): every checkpoint
    evaluated exactly once by a job whose id is journaled, none removed while its job was
    pending or running (its removal comes after the job's end), the best kept."""
    ckpt = tmp_path / "run"
    script = tmp_path / "eval.py"
    script.write_text("BEST = 6\n" + EVAL)
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            *("--on-save", str(script), "--name", "eval", "--via", "slurm"),
            *("--sbatch-args", "-c1", "--job-poll", "0.5", "--job-env", "EVAL_SECONDS"),
        ],
        env={**os.environ, **_env(slurm, EVAL_SECONDS="2")},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        proc = train(
            ckpt,
            *("--max-steps", "15", "--save-every", "3", "--keep-last-n", "1"),
            *("--keep-best", "accuracy:max"),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        code = watcher.wait(timeout=300)
    finally:
        watcher.kill()
    assert code == 0, watcher.stderr.read()[-3000:] if watcher.stderr else ""
    recs = records(ckpt)
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    assert len(saves) == 5
    by_ckpt = _jobs_by_checkpoint(recs)
    assert sorted(by_ckpt) == sorted(saves) and all(len(v) == 1 for v in by_ckpt.values())
    results = _results(ckpt, "eval")
    assert [r["status"] for r in results] == ["ok"] * 5  # the eval saw its checkpoint throughout
    assert {r["jobs"][0]["id"] for r in results} == {j for v in by_ckpt.values() for j in v}
    for r in recs:
        if r["event"] == "checkpoint_removed":
            path = r["data"]["checkpoint_path"]
            ended = [
                j["seq"]
                for j in recs
                if j["event"] == "job"
                and j["data"]["checkpoint_path"] == path
                and j["data"]["state"] == "COMPLETED"
            ]
            assert ended and ended[0] < r["seq"], f"{path} removed before its job ended"
    best = str(ckpt / "checkpoints" / "step-000006")
    assert Path(best).is_dir()
    q = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")  # reports after
    assert q.returncode == 0 and q.stdout.strip() == best  # train_end count too
    on_disk = sorted(p.name for p in (ckpt / "checkpoints").glob("step-*"))
    assert on_disk == ["step-000006", "step-000015"]  # the best and the last (keep-last-n 1)
    assert not list((ckpt / "leases").glob("*.json"))


def _doc_script() -> str:
    """The sbatch script of docs/slurm.md (the block after its ``slurm-script`` mark)."""
    doc = (Path(__file__).parent.parent / "docs" / "slurm.md").read_text()
    block = doc.split("<!-- slurm-script -->", 1)[1].split("```bash\n", 1)[1]
    return block.split("```", 1)[0]


@pytest.mark.extended
@pytest.mark.dist
def test_the_documented_sbatch_script_trains_and_is_followed_outside(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """docs/slurm.md's script submitted with sbatch (1 node, 2 ranks): ilab-train trains and
    journals, the watcher in the script evaluates every save as a job of its own, and a
    watcher outside the job follows the run to its end."""
    ckpt = tmp_path / "run"
    job = tmp_path / "train.sbatch"
    job.write_text(_doc_script())
    script = tmp_path / "eval.py"
    script.write_text("BEST = 8\n" + EVAL)
    env = {
        **os.environ,
        **_env(slurm, OMP_NUM_THREADS="1", EVAL_SECONDS="0.2"),
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "RUN": str(ckpt),
        "NPROC": "2",
        "TRAIN_ARGS": "--demo --max-steps 12 --save-every 4 --quiet",
        "EVAL": str(script),
        "EVAL_SBATCH_ARGS": "-c1",
    }
    log = tmp_path / "train.log"
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--cpus-per-task=1", f"--output={log}", str(job)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert submitted.returncode == 0, submitted.stderr
    train_job = submitted.stdout.strip()
    seen = tmp_path / "seen.sh"
    seen.write_text('#!/bin/sh\necho "$ILAB_STEP" >> "$(dirname "$0")/seen.txt"\n')
    seen.chmod(0o755)
    outside = cli(
        "ilab-watch", str(ckpt), "--on-save", str(seen), "--name", "outside", env=env, timeout=400
    )
    assert outside.returncode == 0, outside.stderr

    def job_state() -> str:
        return subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", train_job, "-o", "%T"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()

    wait_for(lambda: job_state() in ("COMPLETED", "FAILED"), 300, "the training job's end")
    text = log.read_text() if log.exists() else ""
    assert job_state() == "COMPLETED", text[-3000:]
    recs = records(ckpt)
    begin = next(r for r in recs if r["event"] == "train_begin")
    assert begin["data"]["world_size"] == 2 and begin["data"]["nnodes"] == 1
    end = next(r for r in recs if r["event"] == "train_end")
    assert end["data"]["status"] == "completed"
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    assert len(saves) == 3
    by_ckpt = _jobs_by_checkpoint(recs)  # the watcher inside: a job per save
    assert sorted(by_ckpt) == sorted(saves) and all(len(v) == 1 for v in by_ckpt.values())
    inside = [p for p in (ckpt / "watch").glob("*.results.jsonl") if p.stem != "outside.results"]
    (results,) = inside
    lines = [json.loads(x) for x in results.read_text().splitlines()]
    assert [r["status"] for r in lines if r["event"] == "save"] == ["ok"] * 3
    steps = sorted(int(x) for x in (tmp_path / "seen.txt").read_text().split())
    assert steps == [r["step"] for r in recs if r["event"] == "save"]


@pytest.mark.extended
def test_cancel_on_abort_cancels_the_queued_jobs(slurm: SlurmCluster, tmp_path: Path) -> None:
    """--cancel-on-abort: a train_end of an aborted run cancels the jobs still queued; their
    deliveries are skipped (not failures) and their checkpoints released."""
    from journal import JournalWriter

    ckpt = tmp_path / "run"
    ckpt.mkdir()
    w = write_run(ckpt, steps=10, save_every=5, end=None)
    for s in (5, 10):
        make_checkpoint(ckpt, s, w.run_id)
    blocker = subprocess.run(
        ["sbatch", "--parsable", f"-c{slurm.cpus}", "-o", "/dev/null", "--wrap", "sleep 300"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            *("--on-save", "true", "--name", "eval", "--concurrency", "2", "--via", "slurm"),
            *("--sbatch-args", "-c1", "--job-poll", "0.3", "--cancel-on-abort"),
        ],
        env={**os.environ, **_env(slurm)},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: len(_jobs_by_checkpoint(records(ckpt))) == 2, 60, "two queued jobs journaled"
        )
        with JournalWriter(ckpt, join=True) as end:
            end.append("train_end", {"status": "stopped", "command": "abort", "reason": "t"})
        code = watcher.wait(timeout=60)
    finally:
        watcher.kill()
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
    assert code == 0, watcher.stderr.read() if watcher.stderr else ""
    results = [r for r in _results(ckpt, "eval") if r["event"] == "save"]
    assert [r["status"] for r in results] == ["skipped", "skipped"]
    assert all("the run was aborted" in r["error"] for r in results)
    states = [r["data"]["state"] for r in records(ckpt) if r["event"] == "job"]
    assert states.count("CANCELLED") == 2
    assert not list((ckpt / "leases").glob("*.json"))


@pytest.mark.extended
def test_a_job_past_its_timeout_is_cancelled(slurm: SlurmCluster, tmp_path: Path) -> None:
    """--timeout counts from the job's start: then scancel, a 'timeout' delivery, and the
    job's CANCELLED state journaled."""
    ckpt = _saved_run(tmp_path, saves=1)
    out = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", "sleep 120", "--name", "slow", "--timeout", "1", "--replay"),
        *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3"),
        env=_env(slurm),
        timeout=120,
    )
    assert out.returncode == 1, out.stderr
    (res,) = _results(ckpt, "slow")
    assert res["status"] == "timeout" and "cancelled" in res["error"]
    states = [r["data"]["state"] for r in records(ckpt) if r["event"] == "job"]
    assert states[-1] == "CANCELLED"


# -- issue 43: nothing pinned, nothing crossed, nothing silent -------------------------------


def _block_cpus(slurm: SlurmCluster) -> str:
    """A job holding every CPU of the node: the jobs submitted after it stay PENDING."""
    return subprocess.run(
        ["sbatch", "--parsable", f"-c{slurm.cpus}", "-o", "/dev/null", "--wrap", "sleep 300"],
        env=slurm.env,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.strip()


def _state(slurm: SlurmCluster, job_id: str) -> str:
    """The job's state and reason as squeue says them (``PENDING|JobHeldAdmin``)."""
    return (
        subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job_id, "-O", "State:|,Reason:|"],
            env=slurm.env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        .stdout.strip()
        .rstrip("|")
    )


def _counted_squeue(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose ``squeue`` is the real one, each call noted in the returned file (how a
    test counts a watcher's polls)."""
    calls = tmp_path / "squeue.calls"
    shim = tmp_path / "bin" / "squeue"
    shim.parent.mkdir()
    real = shutil.which("squeue")
    shim.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    shim.chmod(0o755)
    calls.touch()
    return f"{shim.parent}{os.pathsep}{os.environ['PATH']}", calls


def _markers(ckpt: Path, name: str) -> list[Path]:
    """The watcher's job markers (watch/<name>.jobs/<delivery>.json; not the jobs' files)."""
    jobs = ckpt / "watch" / f"{name}.jobs"
    return [p for p in jobs.glob("*.json") if not p.name.endswith((".event.json", ".report.json"))]


def _job_id(ckpt: Path, name: str) -> str | None:
    """The id of the one job a watcher noted in its marker, once noted."""
    for path in _markers(ckpt, name):
        job_id = json.loads(path.read_text()).get("job_id")
        if job_id:
            return str(job_id)
    return None


def _watch_gated_eval(
    ckpt: Path, script: Path, slurm: SlurmCluster, err: IO[str]
) -> subprocess.Popen[bytes]:
    """``ilab-watch`` replaying the run's saves into ``script`` as Slurm jobs, polled often."""
    return subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            *("--on-save", str(script), "--name", "eval", "--replay"),
            *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3"),
        ],
        env={**os.environ, **_env(slurm)},
        stderr=err,
    )


def _gated_eval(tmp_path: Path) -> Path:
    """An eval that notes each run (its job id in ``runs``), waits for ``go``, reports."""
    script = tmp_path / "gated.sh"
    script.write_text(
        f'#!/bin/sh\necho "$SLURM_JOB_ID" >> {tmp_path}/runs\n'
        f"while [ ! -e {tmp_path}/go ]; do sleep 0.05; done\n"
        'printf \'{"accuracy": 0.5}\' > "$ILAB_REPORT"\necho evaluated\n'
    )
    script.chmod(0o755)
    return script


def test_a_restarted_watcher_ends_a_job_slurm_forgot_as_lost(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 43: a watcher restarted after kill -9 whose only job Slurm no longer knows
    (purged after MinJobAge; here an id it never issued, which squeue answers the same way:
    one id, exit 1, "Invalid job id specified") ends it LOST after 3 polls, a failed
    delivery, its lease released: it no longer waits for ever renewing the lease."""
    ckpt = _saved_run(tmp_path, saves=1)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    argv = [str(ckpt), "--on-save", str(script), "--name", "eval", "--via", "slurm"]
    argv += ["--sbatch-args", "-c1", "--job-poll", "0.3", "--replay"]
    blocker = _block_cpus(slurm)
    first = subprocess.Popen(
        [str(BIN / "ilab-watch"), *argv],
        env={**os.environ, **_env(slurm)},
        stderr=subprocess.DEVNULL,
    )
    try:
        job = wait_for(lambda: _job_id(ckpt, "eval"), 60, "the job's id in the marker")
        first.send_signal(signal.SIGKILL)
        first.wait()
    finally:
        first.kill()
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
    subprocess.run(["scancel", job], env=slurm.env, timeout=30)
    (marker,) = _markers(ckpt, "eval")
    forgotten = str(int(job) + 100_000)
    marker.write_text(marker.read_text().replace(f'"{job}"', f'"{forgotten}"'))
    assert _state(slurm, forgotten) == ""
    path, calls = _counted_squeue(tmp_path)
    again = cli("ilab-watch", *argv, env=_env(slurm, PATH=path), timeout=60)
    assert again.returncode == 1, again.stderr
    (res,) = _results(ckpt, "eval")
    assert res["status"] == "failed" and f"slurm job {forgotten} LOST" in res["error"]
    assert res["jobs"][0]["adopted"] and [s["state"] for s in res["jobs"][0]["states"]] == ["LOST"]
    assert len(calls.read_text().splitlines()) == 3  # LOST at the third poll, not later
    lost = [r["data"] for r in records(ckpt) if r["event"] == "job"][-1]
    assert (lost["job_id"], lost["state"]) == (forgotten, "LOST")
    holders = [json.loads(p.read_text())["holder"] for p in (ckpt / "leases").glob("*.json")]
    assert all(h.endswith(f":{first.pid}") for h in holders)  # only the killed one's is left


def test_a_percent_in_the_run_dir_is_no_sbatch_pattern(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Issue 43: a run dir named with %j and %x (sbatch's --output patterns): the job runs,
    and its log is where the result says, with the eval's output in it."""
    base = tmp_path / "exp%j-%x"
    base.mkdir()
    ckpt = _saved_run(base, saves=1)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    out = cli(
        "ilab-watch",
        str(ckpt),
        *("--on-save", str(script), "--name", "eval", "--replay"),
        *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3"),
        *("--job-env", "EVAL_SECONDS"),
        env=_env(slurm, EVAL_SECONDS="0"),
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (res,) = _results(ckpt, "eval")
    assert res["status"] == "ok"
    log = Path(res["log_path"])
    assert "%j-%x" in str(log) and "evaluated" in log.read_text()
    assert any(r["event"] == "report" for r in records(ckpt))


def test_a_job_slurm_requeued_after_it_ended_is_done_and_runs_once(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 43: the job ran and wrote exit code 0, then Slurm put it back in the queue,
    held (what a slurmctld restart after kill -9 does to jobs that ended meanwhile; here
    ``scontrol requeuehold`` while the watcher is stopped). The exit file wins: the delivery
    is ok with its report, the held copy is cancelled (said once), the eval ran once."""
    ckpt = _saved_run(tmp_path, saves=1)
    script = _gated_eval(tmp_path)
    errors = tmp_path / "watcher.err"
    with open(errors, "w") as err:
        watcher = _watch_gated_eval(ckpt, script, slurm, err)
    try:
        wait_for(lambda: (tmp_path / "runs").exists(), 60, "the eval's start")
        job = (tmp_path / "runs").read_text().split()[0]
        watcher.send_signal(signal.SIGSTOP)  # it must not see the job COMPLETED
        (tmp_path / "go").touch()
        wait_for(lambda: _state(slurm, job).startswith("COMPLETED"), 60, "the job's end")
        subprocess.run(["scontrol", "requeuehold", job], env=slurm.env, check=True, timeout=30)
        wait_for(lambda: _state(slurm, job).startswith("PENDING"), 30, "the held copy")
        watcher.send_signal(signal.SIGCONT)
        code = watcher.wait(timeout=60)
    finally:
        watcher.send_signal(signal.SIGCONT)
        watcher.kill()
        subprocess.run(["scancel", job], env=slurm.env, timeout=30)
    assert code == 0, errors.read_text()
    (res,) = _results(ckpt, "eval")
    assert res["status"] == "ok" and res["exit_code"] == 0 and "evaluated" in res["stdout_tail"]
    assert any(r["event"] == "report" for r in records(ckpt))
    assert wait_for(lambda: _state(slurm, job).startswith("CANCELLED"), 30, "the copy cancelled")
    said = [ln for ln in errors.read_text().splitlines() if "does not run twice" in ln]
    assert len(said) == 1 and f"slurm job {job} ended (exit code 0)" in said[0]
    assert (tmp_path / "runs").read_text().split() == [job]  # one run
    assert not list((ckpt / "leases").glob("*.json"))


@pytest.mark.extended
def test_a_job_that_ends_while_slurmctld_is_down_is_evaluated_once(tmp_path: Path) -> None:
    """Issue 43, the real thing, on a cluster of its own (a restarted slurmctld that lost
    its last state save may give a forgotten job's id to the next job and drain the node):
    kill -9 of slurmctld while an eval job runs, the job ends meanwhile (exit file 0),
    slurmctld restarted on its saved state. The watcher, stopped throughout (as on a node
    reboot), then finishes the delivery from the exit file. Where Slurm queued the job
    again (its save said PENDING), the watcher says so and cancels that copy; either way
    the eval ran once."""
    from tests.slurm_cluster import SlurmUnavailable, start_cluster

    ckpt = _saved_run(tmp_path, saves=1)
    script = _gated_eval(tmp_path)
    errors = tmp_path / "watcher.err"
    try:
        slurm = start_cluster(tmp_path / "slurm")
    except SlurmUnavailable as exc:
        pytest.skip(str(exc))
    try:
        with open(errors, "w") as err:
            watcher = _watch_gated_eval(ckpt, script, slurm, err)
        try:
            wait_for(lambda: (tmp_path / "runs").exists(), 60, "the eval's start")
            job = (tmp_path / "runs").read_text().split()[0]
            watcher.send_signal(signal.SIGSTOP)
            slurm.kill_controller()
            (tmp_path / "go").touch()
            wait_for(lambda: list((ckpt / "watch" / "eval.jobs").glob("*.exit")), 60, "exit file")
            slurm.start_controller()
            requeued = _state(slurm, job).startswith("PENDING")
            watcher.send_signal(signal.SIGCONT)
            code = watcher.wait(timeout=60)
            final = ("", "COMPLETED", "CANCELLED")  # "": the restarted slurmctld forgot it
            wait_for(lambda: _state(slurm, job).split("|")[0] in final, 90, "the job's end")
        finally:
            watcher.send_signal(signal.SIGCONT)
            watcher.kill()
    finally:
        slurm.stop()
    assert code == 0, errors.read_text()
    (res,) = _results(ckpt, "eval")
    assert res["status"] == "ok" and res["exit_code"] == 0
    assert (tmp_path / "runs").read_text().split() == [job]  # one run of the eval
    if requeued:
        assert "does not run twice" in errors.read_text()


def _aborted_then_resumed(tmp_path: Path, *, aborted: bool = True) -> Path:
    """A run whose attempt 1 saved step 5 and 10 and (``aborted``) ended by an abort
    command; attempt 2 resumed from step 10, saved step 15 and completed."""
    ckpt = tmp_path / "run"
    ckpt.mkdir(exist_ok=True)
    if not (ckpt / "journal.jsonl").exists():
        w = write_run(ckpt, steps=10, save_every=5, end=None)
        for s in (5, 10, 15):
            make_checkpoint(ckpt, s, w.run_id)
    if aborted:
        from journal import JournalWriter

        with JournalWriter(ckpt, join=True) as end:
            end.append(
                "train_end", {"status": "stopped", "command": "abort", "reason": "t"}, step=10
            )
        with JournalWriter(ckpt, resume=True) as w2:
            w2.append("train_begin", {"world_size": 2, "resumed_from": "step-000010"}, step=10)
            path = str(ckpt / "checkpoints" / "step-000015")
            w2.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=15)
            w2.append("train_end", {"status": "completed", "reason": None}, step=15)
    return ckpt


def test_cancel_on_abort_spares_the_resumed_attempt_in_a_replay(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 43: --cancel-on-abort replaying a journal whose attempt 1 was aborted and
    attempt 2 resumed: attempt 1's queued jobs are cancelled (skipped), attempt 2's save is
    evaluated; the summary says the skips were the abort's, not removed checkpoints."""
    ckpt = _aborted_then_resumed(tmp_path)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    blocker = _block_cpus(slurm)  # attempt 1's jobs stay queued until the abort
    errors = tmp_path / "watcher.err"
    with open(errors, "w") as err:
        watcher = subprocess.Popen(
            [
                str(BIN / "ilab-watch"),
                str(ckpt),
                *("--on-save", str(script), "--name", "eval", "--replay", "--concurrency", "3"),
                *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.3"),
                *("--cancel-on-abort", "--job-env", "EVAL_SECONDS"),
            ],
            env={**os.environ, **_env(slurm, EVAL_SECONDS="0")},
            stderr=err,
        )
    try:

        def attempt_1_done() -> bool:
            path = ckpt / "watch" / "eval.results.jsonl"
            results = _results(ckpt, "eval") if path.exists() else []
            return len([r for r in results if r["event"] == "save" and r["step"] < 15]) == 2

        wait_for(attempt_1_done, 60, "attempt 1's two deliveries")
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
        code = watcher.wait(timeout=90)
    finally:
        watcher.kill()
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
    assert code == 0, errors.read_text()
    by_step = {r["step"]: r for r in _results(ckpt, "eval") if r["event"] == "save"}
    assert {s: r["status"] for s, r in by_step.items()} == {5: "skipped", 10: "skipped", 15: "ok"}
    assert all("the run was aborted" in by_step[s]["error"] for s in (5, 10))
    ends = [r["data"] for r in records(ckpt) if r["event"] == "job"]
    assert [d["state"] for d in ends if d["step"] == 15][-1] == "COMPLETED"
    assert "ok, 0 failed, 2 skipped (run aborted); results in" in errors.read_text()


def test_a_watcher_restarted_before_an_abort_evaluates_the_resumed_attempt(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 43: a --cancel-on-abort watcher whose cursor stands before attempt 1's abort
    (it ran before the abort was journaled) meets the abort, then attempt 2's save: that
    save is evaluated, not skipped."""
    ckpt = _aborted_then_resumed(tmp_path, aborted=False)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    argv = [str(ckpt), "--on-save", str(script), "--name", "eval", "--replay", "--via", "slurm"]
    argv += ["--sbatch-args", "-c1", "--job-poll", "0.3", "--cancel-on-abort"]
    argv += ["--job-env", "EVAL_SECONDS"]
    env = _env(slurm, EVAL_SECONDS="0")
    first = cli("ilab-watch", *argv, env=env, timeout=120)
    assert first.returncode == 0, first.stderr
    _aborted_then_resumed(tmp_path)
    again = cli("ilab-watch", *argv, env=env, timeout=120)
    assert again.returncode == 0, again.stderr
    by_step = {r["step"]: r["status"] for r in _results(ckpt, "eval") if r["event"] == "save"}
    assert by_step == {5: "ok", 10: "ok", 15: "ok"}
    assert "ok, 0 failed; results in" in again.stderr  # nothing skipped


def test_array_and_hold_are_refused_at_start(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Issue 43: --array (one checkpoint's eval once per index) and --hold (a job that never
    starts), in --sbatch-args however spelled or in sbatch's environment variables, are a
    usage error before anything is submitted: one line naming it, exit 2."""
    ckpt = _saved_run(tmp_path, saves=1)
    before = set(_squeue_all(slurm))
    cases = [
        (("--sbatch-args", "-c1 --array=0-3"), {}, "--array=0-3 is refused: a job array"),
        (("--sbatch-args", "-c1 -a 0-3"), {}, "-a (--array) is refused"),
        (("--sbatch-args", "-Hc1"), {}, "-Hc1 (--hold) is refused: a held job never starts"),
        ((), {"SBATCH_ARRAY_INX": "0-3"}, "SBATCH_ARRAY_INX is set in the environment"),
    ]
    for args, extra, says in cases:
        out = cli(
            "ilab-watch",
            str(ckpt),
            *("--on-save", "true", "--replay", "--via", "slurm", *args),
            env=_env(slurm, **extra),
        )
        assert out.returncode == 2, out.stderr
        (line,) = [ln for ln in out.stderr.splitlines() if ln.startswith("Error:")]
        assert says in line and "Traceback" not in out.stderr
    assert set(_squeue_all(slurm)) == before  # nothing submitted
    assert not (ckpt / "watch" / "eval.jobs").exists()


def test_a_held_job_is_said_once_and_runs_when_released(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """Issue 43: a job held while queued (``scontrol hold``) is one console line naming it,
    its reason and how to release it, said once however many polls; released, it runs."""
    ckpt = _saved_run(tmp_path, saves=1)
    script = tmp_path / "eval.py"
    script.write_text("BEST = 5\n" + EVAL)
    blocker = _block_cpus(slurm)
    path, calls = _counted_squeue(tmp_path)
    errors = tmp_path / "watcher.err"
    with open(errors, "w") as err:
        watcher = subprocess.Popen(
            [
                str(BIN / "ilab-watch"),
                str(ckpt),
                *("--on-save", str(script), "--name", "eval", "--replay"),
                *("--via", "slurm", "--sbatch-args", "-c1", "--job-poll", "0.2"),
                *("--job-env", "EVAL_SECONDS"),
            ],
            env={**os.environ, **_env(slurm, EVAL_SECONDS="0", PATH=path)},
            stderr=err,
        )
    try:
        job = wait_for(lambda: _job_id(ckpt, "eval"), 60, "the job's id")
        subprocess.run(["scontrol", "hold", job], env=slurm.env, check=True, timeout=30)
        wait_for(lambda: "is held" in errors.read_text(), 30, "the held line")
        n = len(calls.read_text().splitlines())
        wait_for(lambda: len(calls.read_text().splitlines()) >= n + 3, 30, "3 polls more")
        assert _state(slurm, job) == "PENDING|JobHeldAdmin"
        subprocess.run(["scontrol", "release", job], env=slurm.env, check=True, timeout=30)
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
        code = watcher.wait(timeout=90)
    finally:
        watcher.kill()
        subprocess.run(["scancel", blocker], env=slurm.env, timeout=30)
    assert code == 0, errors.read_text()
    said = [ln for ln in errors.read_text().splitlines() if "is held" in ln]
    assert said == [
        f"ilab-watch: slurm job {job} (step-000005) is held (JobHeldAdmin): it starts only "
        f"once released (scontrol release {job})"
    ]
    (res,) = _results(ckpt, "eval")
    assert res["status"] == "ok"
