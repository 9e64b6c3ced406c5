"""A one-node Slurm cluster in a temp dir, for tests and benchmarks/bench_slurm.py.

Debian's ``slurm-wlm`` and ``munge`` packages run as root with everything in one directory:
``slurm.conf`` (free ports, state and spool dirs, logs and pid files there), a munge key
and socket of its own (the machine's munged, if any, is left alone), and ``slurmctld`` and
``slurmd`` in the foreground, stopped by pid. ``SLURM_CONF`` points the client commands
(``sbatch``, ``squeue``, ...) at it. Where Slurm is missing, :func:`start_cluster`
installs the packages with apt first when it can (root, apt-get: tests/apt.py), so a fresh
machine's ``make test`` runs the Slurm tests as ``.ci/run`` does; where it still is not
installed or cannot start, it raises :class:`SlurmUnavailable` with the reason (the
fixture skips).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.apt import apt_install

START_DEADLINE_S = 60.0
_DAEMONS = ("munged", "slurmctld", "slurmd")
_CLIENTS = ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun")
#: Debian's packages that hold them.
PACKAGES = ("slurm-wlm", "munge")


class SlurmUnavailable(RuntimeError):
    """Slurm is not installed here, or its daemons did not start (the message says why)."""


@dataclass
class SlurmCluster:
    """A running one-node cluster: ``env`` is ``os.environ`` with ``SLURM_CONF`` set."""

    root: Path
    conf: Path
    node: str
    cpus: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def kill_controller(self) -> None:
        """``kill -9`` of slurmctld (a controller crash); the node's daemon runs on."""
        ctld = self._controller()
        ctld.kill()
        ctld.wait()

    def start_controller(self) -> None:
        """Start slurmctld again on its saved state, as after a crash, and wait until it
        answers (``sinfo``)."""
        old = self._controller()
        log = open(self.root / "slurmctld.out", "ab")  # noqa: SIM115 - the daemon keeps it
        new = subprocess.Popen(
            _controller_argv(self.conf), env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.procs[self.procs.index(old)] = new
        _wait(lambda: _node_state(self.env) != "", self, "slurmctld did not answer again")

    def _controller(self) -> subprocess.Popen[bytes]:
        return next(p for p in self.procs if p.args == _controller_argv(self.conf))

    def stop(self) -> None:
        """Stop the daemons this cluster started (newest first), by pid."""
        for proc in reversed(self.procs):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.procs.clear()


def _controller_argv(conf: Path) -> list[str]:
    """slurmctld in the foreground; ``-i``: start on whatever state it saved."""
    return ["slurmctld", "-D", "-i", "-f", str(conf)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _missing() -> list[str]:
    """The daemons and client commands not on PATH."""
    return [n for n in (*_DAEMONS, *_CLIENTS) if shutil.which(n) is None]


def _unavailable() -> str | None:
    """Why no cluster can start here; None once root has Slurm (installed with apt first
    where it is missing and can be: tests/apt.py, as for the browser tests' chromium)."""
    if hasattr(os, "geteuid") and os.geteuid() != 0:
        return "the local Slurm cluster runs its daemons as root (SlurmUser=root)"
    if why := apt_install(list(PACKAGES), lambda: not _missing()):
        return f"Slurm is not installed ({', '.join(_missing())} missing): {why}"
    return None


def write_conf(root: Path, node: str, cpus: int, munge_socket: Path) -> Path:
    """``slurm.conf`` for one node named ``node`` with ``cpus`` CPUs, all state in ``root``."""
    for sub in ("state", "spool"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(
        f"""ClusterName=ilabtest
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={root / "state"}
SlurmdSpoolDir={root / "spool"}
SlurmctldPidFile={root / "slurmctld.pid"}
SlurmdPidFile={root / "slurmd.pid"}
SlurmctldLogFile={root / "slurmctld.log"}
SlurmdLogFile={root / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=600
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""
    )
    return conf


def _node_state(env: dict[str, str]) -> str:
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%T"],
            env=env,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except subprocess.TimeoutExpired:
        return ""
    return out.stdout.strip()


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def start_cluster(root: Path) -> SlurmCluster:
    """Start munged, slurmctld and slurmd for a one-node cluster in ``root`` and wait until
    ``sinfo`` shows the node idle. Raises :class:`SlurmUnavailable` with the reason."""
    if why := _unavailable():
        raise SlurmUnavailable(why)
    root.mkdir(parents=True, exist_ok=True)
    node = socket.gethostname().split(".")[0]
    cpus = os.cpu_count() or 1
    key = root / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    munge_socket = root / "munge.socket"
    conf = write_conf(root, node, cpus, munge_socket)
    cluster = SlurmCluster(root, conf, node, cpus)
    env = cluster.env
    commands = [
        [
            "munged",
            "-F",
            "--force",
            f"--key-file={key}",
            f"--socket={munge_socket}",
            f"--pid-file={root / 'munged.pid'}",
            f"--log-file={root / 'munged.log'}",
            f"--seed-file={root / 'munged.seed'}",
        ],
        _controller_argv(conf),
        ["slurmd", "-D", "-f", str(conf), "-N", node],
    ]
    try:
        for argv in commands:
            log = open(root / f"{argv[0]}.out", "wb")  # noqa: SIM115 - the daemon keeps it
            cluster.procs.append(
                subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
            log.close()
            if argv[0] == "munged":
                _wait(lambda: munge_socket.exists(), cluster, "munged made no socket")
        _wait(lambda: _node_state(env) == "idle", cluster, "the node never became idle")
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(ready: object, cluster: SlurmCluster, what: str) -> None:
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline:
        if callable(ready) and ready():
            return
        for proc in cluster.procs:
            if proc.poll() is not None:
                name = Path(str(proc.args[0])).name  # type: ignore[index]
                log = _tail(cluster.root / f"{name}.log") or _tail(cluster.root / f"{name}.out")
                raise SlurmUnavailable(f"{name} exited with {proc.returncode}: {log}")
        time.sleep(0.2)
    raise SlurmUnavailable(
        f"{what} within {START_DEADLINE_S:g}s: {_tail(cluster.root / 'slurmd.log')}"
    )


@contextlib.contextmanager
def running_cluster(root: Path) -> Iterator[SlurmCluster]:
    """A started cluster, stopped on exit."""
    cluster = start_cluster(root)
    try:
        yield cluster
    finally:
        cluster.stop()
