"""Shared test helpers: real subprocesses of the installed console scripts, real training
runs, and journals written through the real writer. Tests import helpers from here
(tests/conftest.py holds only pytest's hooks and fixtures)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from hypothesis import strategies as st

from journal import JournalWriter, read_all
from journal.record.fields import PAYLOAD_TYPES
from journal.rundir.paths import journal_path

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**53), 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)


#: Payload keys the readers type-check (journal/record/fields.py): a random value there
#: (``"loss": []``) makes a record the readers skip, which these strategies do not mean
_RULED_KEYS = frozenset(k for rules in PAYLOAD_TYPES.values() for k in rules)

payloads = st.dictionaries(
    st.text(min_size=1, max_size=10).filter(lambda k: k not in _RULED_KEYS),
    st.recursive(
        json_scalars,
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=8,
    ),
    max_size=5,
)


#: Journal contents for property tests: (event, payload, step) triples, odd names included.
records_st = st.lists(
    st.tuples(
        st.sampled_from(["log", "save", "step_end", "evaluate", "weird\n\u2028event"]),
        payloads,
        st.integers(0, 10**6),
    ),
    min_size=0,
    max_size=12,
)


ROOT = Path(__file__).resolve().parent.parent


def _scripts_dir() -> Path:
    """Where this interpreter's console scripts (``ilab-train``, ...) are: beside it in a
    venv; for a system Python, the install scheme's scripts dir (/usr/local/bin, or
    ~/.local/bin for a --user install)."""
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts"))]
    with contextlib.suppress(KeyError):
        candidates.append(Path(sysconfig.get_path("scripts", f"{os.name}_user")))
    return next((d for d in candidates if (d / "ilab-journal").exists()), candidates[0])


BIN = _scripts_dir()


# -- GPUs: hidden from every test but those marked gpu --------------------------------------
#
# The suite's CPU tests run 2 gloo ranks; with a GPU visible, `--backend auto` would pick
# NCCL and a second rank on a one-GPU machine dies in set_device. So GPUs are hidden for the
# whole pytest process, at conftest import (hide_gpus): before anything in it can initialise CUDA (torch
# counts devices once per process and caches the count) and before module- or session-
# scoped fixtures start their runs (a per-test monkeypatch would come too late for those).
# In-process code (run_training's preflight) and every subprocess that inherits os.environ
# then see none, so the suite passes alike with 0, 1 or 8 GPUs. Tests marked gpu get the
# machine's real value back (conftest's autouse fixture; `real_gpu_env` for their commands).
# pytest-xdist's workers (make test) inherit the first pytest process's environment, GPUs
# already hidden: that process hands the machine's value on in REAL_GPUS_ENV.
REAL_GPUS_ENV = "ILAB_TEST_REAL_CUDA_VISIBLE_DEVICES"
_UNSET = "<unset>"


def _real_cuda_visible_devices() -> str | None:
    """``CUDA_VISIBLE_DEVICES`` as the machine has it (None: unset), passed on to children."""
    carried = os.environ.get(REAL_GPUS_ENV)
    if carried is not None:
        return None if carried == _UNSET else carried
    real = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ[REAL_GPUS_ENV] = _UNSET if real is None else real
    return real


REAL_CUDA_VISIBLE_DEVICES = _real_cuda_visible_devices()


def real_gpu_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: os.environ) with the GPUs this machine really shows."""
    out = dict(os.environ if env is None else env)
    if REAL_CUDA_VISIBLE_DEVICES is None:
        out.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        out["CUDA_VISIBLE_DEVICES"] = REAL_CUDA_VISIBLE_DEVICES
    return out


@functools.cache
def no_gpu_reason() -> str | None:
    """Why tests marked gpu cannot run here (None: they can). The GPUs are counted in a
    child process with the real environment: this process must not initialise CUDA."""
    import torch

    if not torch.backends.cuda.is_built():
        return f"needs a CUDA GPU (torch {torch.__version__} is built without CUDA)"
    code = "import torch; print(torch.cuda.device_count())"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env=real_gpu_env(),
    )
    out = proc.stdout.split()
    if proc.returncode != 0 or not out or not out[-1].isdigit():
        return f"needs a CUDA GPU (counting them failed: {proc.stderr.strip()[-300:]})"
    return None if int(out[-1]) > 0 else "needs a CUDA GPU (none is visible)"


def pythonpath() -> str:
    """PYTHONPATH for a subprocess that imports ``tests`` or runs from a temp dir: the repo
    first, then what was set (a GPU image may keep the project's dependencies there)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def cli(name: str, *args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run an installed console script (``ilab-journal``, ``ilab-watch``, ``ilab-train``)."""
    exe = BIN / name
    env = {**os.environ, "OMP_NUM_THREADS": "1", **kw.pop("env", {})}
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, env=env, **kw
    )


def train_env(step_delay: float | None = None) -> dict[str, str]:
    """The environment for a training subprocess (one thread; optionally slowed down)."""
    from trainer.rank.loop import STEP_DELAY_ENV  # the trainer's test-only knob (imports torch)

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if step_delay:
        env[STEP_DELAY_ENV] = str(step_delay)
    return env


def train_argv(ckpt: Path, *extra: str) -> list[str]:
    """``ilab-train`` on the demo data with 2 CPU ranks (the suite hides GPUs, see above:
    ``--backend auto`` resolves to gloo)."""
    return [
        str(BIN / "ilab-train"),
        "--demo",
        "--ckpt-dir",
        str(ckpt),
        "--nproc-per-node",
        "2",
        "--quiet",
        *extra,
    ]


def train(ckpt: Path, *extra: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run ``ilab-train`` (demo, 2 ranks) to the end."""
    return subprocess.run(
        train_argv(ckpt, *extra), capture_output=True, text=True, timeout=timeout, env=train_env()
    )


def records(ckpt: Path) -> list[dict[str, Any]]:
    """Every complete record of a run's journal so far ([] before it exists)."""
    path = journal_path(ckpt)
    return read_all(path, final=False).records if path.exists() else []


def kill_tree(pid: int) -> None:
    """SIGKILL a process and all its descendants at once, like a scheduler killing a job.

    (torchrun starts each worker in a session of its own, so a process-group kill misses them.)
    """
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return  # it ended by itself
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    still_running(procs, timeout=30)


def wait_for(pred: Any, timeout: float = 120, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy (and return that), or fail after
    ``timeout`` seconds. The tests' only way to wait: a deadline, never a bare sleep."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def log_payload(step: int, loss: float = 1.0) -> dict[str, Any]:
    """A realistic ``log`` payload (~300 bytes on disk with the envelope)."""
    return {
        "loss": loss,
        "lr": 1e-4,
        "grad_norm": 0.9,
        "elapsed_time": 0.25,
        "tokens_per_s": 4096.0,
        "samples_per_s": 32.0,
        "samples_seen": step * 8,
        "batch_metrics": {
            "total_samples": 8,
            "total_length": 1024,
            "num_loss_counted_tokens": 700,
            "accumulated_loss": loss * 700,
            "grad_accum_steps": 2,
            "num_minibatches": 2,
        },
        "cuda_mem_allocated": None,
        "cuda_max_mem_allocated": None,
    }


def begin_payload(
    total_steps: int,
    *,
    world_size: int = 1,
    hostname: str = "test-host",
    config: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A schema-valid ``train_begin`` payload, for journals written without training."""
    return {
        "config": {"lr": 1e-4} if config is None else config,
        "world_size": world_size,
        "nnodes": 1,
        "device_type": "cpu",
        "journal_detail": "step",
        "resumed_from": None,
        "total_steps": total_steps,
        "hostname": hostname,
        "pid": 1,
        "versions": {"torch": "2"},
    }


#: A callback file (``{out}``: where it writes) for ``ilab-watch --callback cb.py:Count``:
#: counts ``on_log`` calls; at ``on_train_end`` (and at exit, should it be killed) it writes
#: how many it had seen, in all, and after ``on_train_end``. The replay bench and the
#: callback-order tests read it.
COUNT_CALLBACK = '''\
"""Counts on_log calls; on_train_end writes what it saw (the caller reads it), with the
watcher process's peak memory so far (VmHWM: its own; a child's ru_maxrss also counts the
peak of the process that started it)."""
import atexit
import json

OUT = {out!r}


class Count:
    def __init__(self):
        self.n = 0
        self.seen_at_end = None
        self.late = 0
        atexit.register(self.dump)

    def on_log(self, event, **data):
        self.n += 1
        if self.seen_at_end is not None:
            self.late += 1

    def on_train_end(self, event, **data):
        self.seen_at_end = self.n
        self.dump()

    def dump(self):
        with open(OUT, "w") as f:
            with open("/proc/self/status") as status:
                kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
            rss_mb = int(kib) / 1024
            seen = {{"seen_at_end": self.seen_at_end, "on_log": self.n, "late": self.late}}
            json.dump({{**seen, "max_rss_mb": rss_mb}}, f)
'''


def write_log_journal(ckpt: Path, n: int, *, run_id: str = "logs", payload: Any = None) -> None:
    """A finished run of logs only: ``train_begin``, ``n`` log records, ``train_end``
    (the replay benchmark's and the callback-order tests' journal); ``payload(step, loss)``
    makes each log's payload (default :func:`log_payload`)."""
    make = payload or log_payload
    with JournalWriter(ckpt, run_id=run_id, durable_events=frozenset()) as w:
        w.append("train_begin", begin_payload(n), step=0)
        for s in range(1, n + 1):
            w.append("log", make(s, loss=10.0 / s), step=s, samples_seen=s * 8)
        end = {"status": "completed", "reason": None, "final_checkpoint": None}
        w.append("train_end", end, step=n)


def write_steps(w: JournalWriter, first: int, last: int) -> None:
    """Steps ``first..last`` of a run: a log record each; every 4th step also evaluate,
    save (``/c/checkpoints/step-N``) and a report (accuracy step/100). The exporters' tests
    read these back from TensorBoard, MLflow and W&B."""
    for s in range(first, last + 1):
        w.append(
            "log",
            {"loss": 10.0 / s, "lr": 0.001, "grad_norm": 1.5, "tokens_per_s": 100.0 * s},
            step=s,
        )
        if s % 4 == 0:
            w.append(
                "evaluate", {"val_loss": 5.0 / s, "val_num_tokens": 10, "duration": 0.1}, step=s
            )
            path = f"/c/checkpoints/step-{s:06d}"
            w.append(
                "save",
                {
                    "checkpoint_path": path,
                    "kind": ["full_state"],
                    "duration": 0.1,
                    "trigger": "interval",
                },
                step=s,
            )
            w.append(
                "report",
                {
                    "id": f"r{s}",
                    "checkpoint_path": path,
                    "step": s,
                    "metrics": {"accuracy": s / 100},
                    "reported_at": 1.0,
                },
                step=s,
            )


def write_run(
    ckpt: Path,
    steps: int = 10,
    save_every: int = 5,
    end: str | None = "completed",
    resume: bool = False,
) -> JournalWriter:
    """Write a small but schema-valid journal of a run; returns the (closed) writer."""
    w = JournalWriter(ckpt, resume=resume)
    w.append(
        "train_begin",
        {
            "config": {"lr": 1e-4},
            "world_size": 2,
            "nnodes": 1,
            "device_type": "cpu",
            "journal_detail": "step",
            "resumed_from": None,
            "total_steps": steps,
            "hostname": "test-host",
            "pid": 1,
            "versions": {"torch": "x"},
        },
    )
    for s in range(1, steps + 1):
        w.append("step_begin", step=s - 1)
        w.append("log", log_payload(s, 2.0 / s), step=s, samples_seen=s * 8)
        if save_every and s % save_every == 0:
            w.append(
                "save",
                {
                    "checkpoint_path": str(ckpt / f"checkpoints/step-{s:06d}"),
                    "kind": ["full_state", "hf"],
                    "duration": 0.1,
                },
                step=s,
            )
        w.append("step_end", step=s, samples_seen=s * 8)
    if end:
        w.append("train_end", {"status": end, "reason": None, "final_checkpoint": None}, step=steps)
    w.close()
    return w


def make_checkpoint(ckpt: Path, step: int, run_id: str | None, *, complete: bool = True) -> Path:
    """A checkpoint dir as ilab-train leaves it, without tensors: ``full_state/
    trainer_state.json`` names the run that saved it (rotation, resume, prune and export act
    only on their run's), ``full_state/.metadata`` (DCP's, written last) says it is complete."""
    path = journal_path(ckpt).parent / "checkpoints" / f"step-{step:06d}"
    (path / "full_state").mkdir(parents=True)
    state = {"step": step, "epoch": 0, "step_in_epoch": step, "samples_seen": 0, "run_id": run_id}
    (path / "full_state" / "trainer_state.json").write_text(json.dumps(state))
    if complete:
        (path / "full_state" / ".metadata").write_bytes(b"dcp")
    return path


def workers_of(ckpt: Path) -> list[psutil.Process]:
    """Training worker processes of this checkpoint dir, wherever they were re-parented."""
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "trainer.rank.worker" in cmd and any(str(ckpt / "logs") in c for c in cmd):
            out.append(p)
    return out


def still_running(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Wait up to ``timeout`` for ``procs`` to end; return those still running. A zombie has
    ended (it holds no memory, CPU or device, only a pid until its parent, or init, reaps it;
    in a container init may never do so)."""

    def running() -> list[psutil.Process]:
        out = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
        return out

    deadline = time.monotonic() + timeout
    while (alive := running()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def max_step(ckpt: Path) -> int:
    return max((r["step"] for r in records(ckpt)), default=0)


def relaunch_after_killing_the_launcher(tmp_path: Path, kills: int) -> dict[str, Any]:
    """kill -9 of the launcher alone (what the OOM killer does) and an immediate relaunch,
    ``kills`` times, while the killed launch's workers are still finishing; the last launch
    runs to the end. Returns figures for the reliability table."""
    ckpt = tmp_path / "run"
    args = ("--max-steps", "40", "--save-every", "3")

    def launch() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            train_argv(ckpt, *args),
            env=train_env(step_delay=0.1),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    orphans_gone_s: list[float] = []
    job = launch()
    try:
        for _ in range(kills):
            start = max_step(ckpt)
            wait_for(lambda start=start: max_step(ckpt) >= start + 3, what="3 more steps")
            old = workers_of(ckpt)
            assert old, "no worker processes found"
            os.kill(job.pid, signal.SIGKILL)
            job.wait()
            killed = time.monotonic()
            job = launch()  # at once, beside the killed launch's finishing workers
            alive = still_running(old, timeout=45)
            assert not alive, f"orphaned workers still running: {alive}"
            orphans_gone_s.append(time.monotonic() - killed)
        assert job.wait(timeout=300) == 0
    finally:
        job.kill()
    recs = records(ckpt)
    valid = cli("ilab-journal", "validate", str(ckpt))
    assert valid.returncode == 0, valid.stdout
    seqs = [r["seq"] for r in recs]
    assert seqs == sorted(set(seqs))  # strictly increasing: never two writers
    attempts = [r["attempt"] for r in recs]
    assert attempts == sorted(attempts)  # attempts never interleave
    end = recs[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "completed"
    assert end["step"] == 40
    return {"kills": kills, "orphans_gone_max_s": max(orphans_gone_s), "attempts": attempts[-1]}


@contextlib.contextmanager
def small_tmpfs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` (e.g. ``"1m"``) under ``tmp_path``: a disk that really fills
    up. Root only: the test is skipped where mounting is not allowed."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.strip() or 'not root'}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def launch_bridge_script(
    tmp_path: Path,
    script: str,
    steps: int,
    fail_at: int = -1,
    delay: float = 0.0,
    keep: int | None = None,
) -> subprocess.Popen[str]:
    """Start a bridge's test training script under torchrun with 2 CPU ranks, its journal in
    ``tmp_path/out``. The script takes ``OUT STEPS FAIL_AT`` and reads ``STEP_DELAY`` (seconds
    a step) and ``KEEP`` (checkpoints to keep; empty: all) from its environment."""
    path = tmp_path / "train.py"
    path.write_text(script)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    env["STEP_DELAY"], env["KEEP"] = str(delay), str(keep or "")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return subprocess.Popen(
        [*cmd, str(path), str(out), str(steps), str(fail_at)],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop_a_bridge_run(job: subprocess.Popen[str], out: Path) -> tuple[int, list[dict[str, Any]]]:
    """Send ``ilab-journal control stop`` to a 2-rank bridge run (tests' training scripts
    write ``ended-rank{R}.json``, the step each rank ended at) once step 2 has ended; return
    the step both ranks ended at and the journal's records."""
    try:
        wait_for(
            lambda: any(r["event"] == "step_end" and r["step"] >= 2 for r in records(out)),
            what="step 2",
        )
        assert (
            cli("ilab-journal", "control", "stop", str(out), "--reason", "enough").returncode == 0
        )
        _, err = job.communicate(timeout=240)
    finally:
        job.kill()
    assert job.returncode == 0, err[-3000:]
    ended = [json.loads((out / f"ended-rank{r}.json").read_text()) for r in (0, 1)]
    assert ended[0] == ended[1], ended
    recs = records(out)
    control = [r for r in recs if r["event"] == "control"]
    assert [c["data"]["command"] for c in control] == ["stop"]
    assert control[0]["data"]["applied_at_step"] == ended[0]
    end = recs[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "stopped"
    return ended[0], recs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def counting_collectives(args: Any, step_delay: float | None = None) -> subprocess.Popen[str]:
    """Start the real worker on 2 ranks with every torch.distributed call counted
    (tests/collective_counter.py); read the counts with :func:`collective_counts`."""
    from trainer.config import WorkerConfig

    cfg = Path(args.ckpt_dir).parent / f"{Path(args.ckpt_dir).name}.json"
    cfg.write_text(WorkerConfig(args=args).model_dump_json())
    env = {**train_env(step_delay), "PYTHONPATH": pythonpath()}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "tests.collective_counter",
            str(cfg),
        ],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def collective_counts(ckpt: Path) -> dict[str, int]:
    """Rank 0's counts after a :func:`counting_collectives` run (both ranks must agree)."""
    import json

    counts = [json.loads((ckpt / "logs" / f"collectives-rank{r}.json").read_text()) for r in (0, 1)]
    assert counts[0] == counts[1]
    return dict(counts[0])


def hide_gpus() -> None:
    """Hide the GPUs from this process and its children (see REAL_CUDA_VISIBLE_DEVICES)."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def tiny_llama_config() -> Any:
    """The tiny Llama (GQA off, tied embeddings) the HF-model tests train: a
    ``transformers.LlamaConfig``."""
    import transformers

    return transformers.LlamaConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
