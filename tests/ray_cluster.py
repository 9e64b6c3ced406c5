"""A local Ray head on 127.0.0.1, for tests and benchmarks/bench_ray.py.

``ray start --head --block`` in its own session, every port free and chosen here, its
temp dir (sessions, logs, sockets) ours, one CPU and a small object store. Stopped by
its pid: SIGTERM to its process group, then SIGKILL to whatever of ours (a process whose
command line names our temp dir) is left. ``address`` is the job endpoint (the dashboard,
what ``--ray-address`` / ``RAY_ADDRESS`` take). Where Ray is not installed or does not
start, :func:`start_ray` raises :class:`RayUnavailable` with the reason (the fixture skips).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

START_DEADLINE_S = 120.0


class RayUnavailable(RuntimeError):
    """Ray is not installed here, or its head did not start (the message says why)."""


@dataclass
class RayCluster:
    """A running head: ``address`` its job endpoint, ``proc`` the blocking ``ray start``."""

    address: str
    temp_dir: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_ADDRESS": self.address}

    def stop(self) -> None:
        """Stop the head and every process it started (ours only: by pid)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        for pid in _ours(self.temp_dir):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _ours(temp_dir: Path) -> list[int]:
    """The pids of processes whose command line names ``temp_dir`` (Ray's daemons do)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if str(temp_dir).encode() in (entry / "cmdline").read_bytes():
                    out.append(int(entry.name))
    return out


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _answers(address: str) -> bool:
    try:
        with urllib.request.urlopen(f"{address}/api/version", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def start_ray(log_dir: Path) -> RayCluster:
    """Start a head and wait until its job endpoint answers; :class:`RayUnavailable` if not."""
    ray_bin = Path(sys.executable).parent / "ray"
    if not ray_bin.exists():
        raise RayUnavailable("Ray is not installed (pip install 'ray[default]')")
    # Ray's unix sockets live under the temp dir: a short path (the limit is ~107 bytes)
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    ports = _free_ports(9)
    gcs, dash, node, obj, client, agent, agent_grpc, runtime, metrics = ports
    low = 20000 + (os.getpid() * 37) % 30000  # a worker port range unlikely to be in use
    while any(low <= p <= low + 200 for p in ports):  # Ray refuses a port used twice
        low += 201
    argv = [
        str(ray_bin),
        *("start", "--head", "--block", "--disable-usage-stats"),
        *("--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--num-gpus", "0"),
        *("--object-store-memory", str(80 * 1024 * 1024), "--temp-dir", str(temp_dir)),
        f"--port={gcs}",
        *("--include-dashboard", "true", "--dashboard-host", "127.0.0.1"),
        f"--dashboard-port={dash}",
        f"--node-manager-port={node}",
        f"--object-manager-port={obj}",
        f"--ray-client-server-port={client}",
        f"--dashboard-agent-listen-port={agent}",
        f"--dashboard-agent-grpc-port={agent_grpc}",
        f"--runtime-env-agent-port={runtime}",
        f"--metrics-export-port={metrics}",
        f"--min-worker-port={low}",
        f"--max-worker-port={low + 200}",
    ]
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / "ray-head.out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    cluster = RayCluster(f"http://127.0.0.1:{dash}", temp_dir, proc, log)
    deadline = time.monotonic() + START_DEADLINE_S
    while not _answers(cluster.address):
        if proc.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            cluster.stop()
            why = "exited" if proc.returncode is not None else "no answer in time"
            raise RayUnavailable(f"the Ray head did not start ({why}): {' / '.join(tail)}")
        time.sleep(0.5)
    return cluster


@contextlib.contextmanager
def running_ray(log_dir: Path) -> Iterator[RayCluster]:
    """A started head, stopped on exit."""
    cluster = start_ray(log_dir)
    try:
        yield cluster
    finally:
        cluster.stop()
