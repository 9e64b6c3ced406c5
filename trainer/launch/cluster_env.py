"""``ilab-train`` in a cluster's pod or job: node count, node rank and the rendezvous
endpoint from the variables the cluster sets, where the user did not give them.

One place decides, in this order (the first that applies wins):

1. What the user gave (a flag, or the ``torchrun`` mapping of ``--config``), field by field.
2. Kubeflow Trainer v2 (a ``TrainJob`` on the ``torch-distributed`` runtime), which starts
   the container with ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``,
   ``PET_MASTER_ADDR`` and ``PET_MASTER_PORT`` (torchrun's own ``PET_`` names for its
   flags). The v1 training-operator's PyTorchJob sets these too since v1.7, so they win
   over its older variables.
3. PyTorchJob's ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE`` and ``RANK`` (read only in
   a pod: ``KUBERNETES_SERVICE_HOST`` set), with one pod per node: ``WORLD_SIZE`` is taken as the node count and ``RANK`` as this pod's node rank
   (what the operator sets for a torchrun-style launch without ``nprocPerNode``; with it,
   the ``PET_*`` variables are set as well and win).
4. Slurm's ``SLURM_*`` (trainer/launch/slurm_env.py).

A multi-node rendezvous from Kubernetes variables is static (torchrun's ``--master-addr``
and ``--master-port``, the master pod's service name), as Kubeflow's own launches do.
Inconsistent or unusable values are a ValueError of one line naming the variable (the
CLI says it and exits 2). No torch, no cluster needed to import.

What was decided reaches torchrun as flags only (:func:`torchrun_command`), and torchrun
runs without any ``PET_*`` variable (:func:`torchrun_env`): torchrun takes ``PET_<FLAG>``
as the default of each flag it is not given (``PET_NNODES=2`` behind ``--standalone``
would make a one-node run wait for a second node), so a flag the user gave must win there
too.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.config import TorchrunArgs
from trainer.launch.slurm_env import slurm_torchrun
from watcher.alerts.notify import NOTIFY_ENV

DEFAULT_MASTER_PORT = 29500
_PET = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
_PYTORCHJOB = ("MASTER_ADDR", "WORLD_SIZE", "RANK")


def _int(env: Mapping[str, str], name: str, hint: str = "") -> int | None:
    """``env[name]`` as a non-negative integer (None when unset or empty)."""
    text = (env.get(name) or "").strip()
    if not text:
        return None
    if not text.isdigit():
        raise ValueError(f"{name}={text!r} is not a whole number{hint}")
    return int(text)


def kubernetes_source(env: Mapping[str, str]) -> str | None:
    """Which Kubernetes launcher set ``env``: ``"PET"``, ``"PyTorchJob"`` or None. Inside a
    torchrun worker (``LOCAL_RANK`` set) the variables are torchrun's own: None."""
    if "LOCAL_RANK" in env or "TORCHELASTIC_RUN_ID" in env:
        return None
    if any(env.get(k) for k in _PET):
        return "PET"
    # MASTER_ADDR, WORLD_SIZE and RANK are common names (a shell set up for torchrun has
    # them): read as PyTorchJob's only in a pod, where Kubernetes sets its service host
    if all(env.get(k) for k in _PYTORCHJOB) and env.get("KUBERNETES_SERVICE_HOST"):
        return "PyTorchJob"
    return None


def _from_env(env: Mapping[str, str], source: str) -> dict[str, Any]:
    """The torchrun settings ``source``'s variables give (absent ones left out)."""
    got: dict[str, Any] = {}
    if source == "PET":
        hint = " (an elastic range is not supported: give --nnodes)"
        nnodes, rank = _int(env, "PET_NNODES", hint), _int(env, "PET_NODE_RANK")
        names = ("PET_NNODES", "PET_NODE_RANK")
        nproc = (env.get("PET_NPROC_PER_NODE") or "").strip()
        if nproc.isdigit() and int(nproc) >= 1:
            got["nproc_per_node"] = int(nproc)
        elif nproc:  # torchrun's auto/gpu/cpu: ilab-train counts its ranks itself
            raise ValueError(
                f"PET_NPROC_PER_NODE={nproc!r} is not a number of processes: give --nproc-per-node"
            )
        addr = env.get("PET_MASTER_ADDR") or env.get("MASTER_ADDR")
        port = _int(env, "PET_MASTER_PORT") if env.get("PET_MASTER_PORT") else None
        port = port if port is not None else _int(env, "MASTER_PORT")
    else:
        nnodes, rank = _int(env, "WORLD_SIZE"), _int(env, "RANK")
        names = ("WORLD_SIZE", "RANK")
        addr, port = env.get("MASTER_ADDR"), _int(env, "MASTER_PORT")
    if nnodes is not None:
        if nnodes < 1:
            raise ValueError(f"{names[0]}={nnodes}: a job has at least one node")
        got["nnodes"] = nnodes
    if rank is not None:
        if nnodes is not None and rank >= nnodes:
            extra = (
                " (ilab-train reads PyTorchJob's WORLD_SIZE as the node count, one pod per "
                "node; give --nnodes and --node-rank if yours counts processes)"
                if source == "PyTorchJob"
                else ""
            )
            raise ValueError(f"{names[1]}={rank} is not below {names[0]}={nnodes}{extra}")
        got["node_rank"] = rank
    if addr:
        if port is not None and not 1 <= port <= 65535:
            raise ValueError(f"master port {port} is not a port (1-65535)")
        got["master_addr"] = addr.strip()
        got["master_port"] = port or DEFAULT_MASTER_PORT
    return got


def cluster_torchrun(
    given: Mapping[str, Any], env: Mapping[str, str] = os.environ
) -> dict[str, Any]:
    """``given`` (the torchrun settings the user gave) completed from the cluster's
    variables, in the order of the module docstring. Raises ValueError (one line) where
    the variables contradict themselves or cannot be used."""
    source = kubernetes_source(env)
    if source is None:
        return slurm_torchrun(given, env)
    found = _from_env(env, source)
    out = dict(given)
    for key in ("nproc_per_node", "nnodes", "node_rank"):
        if given.get(key) is None and key in found:
            out[key] = found[key]
    nnodes = int(out.get("nnodes") or 1)
    if int(out.get("node_rank") or 0) >= nnodes:
        raise ValueError(
            f"node rank {out.get('node_rank')} (from {source} variables or the flags) is not "
            f"below the node count {nnodes}"
        )
    user_rdzv = any(given.get(k) is not None for k in ("rdzv_endpoint", "master_addr"))
    if nnodes > 1 and not user_rdzv:
        if "master_addr" not in found:
            var = "PET_MASTER_ADDR" if source == "PET" else "MASTER_ADDR"
            raise ValueError(
                f"{nnodes} nodes but {var} is not set: give --master-addr and "
                "--master-port (or --rdzv-endpoint)"
            )
        out["master_addr"] = found["master_addr"]
        if given.get("master_port") is None:
            out["master_port"] = found["master_port"]
    return out


def torchrun_command(cfg_path: Path, t: TorchrunArgs) -> list[str]:
    """The torchrun agent's command line for the workers of ``cfg_path``: every setting of
    ``t`` as a flag (node count, ranks per node, node rank, rendezvous), so that nothing is
    left to torchrun's ``PET_*`` defaults. One node without an address is standalone (a
    local c10d store on a free port, its backend, endpoint and id torchrun's); otherwise a c10d rendezvous at ``rdzv_endpoint`` or
    a static one at ``master_addr:master_port``."""
    cmd = [sys.executable, "-m", "trainer.launch.agent", f"--nnodes={t.nnodes}"]
    cmd += [f"--nproc-per-node={t.nproc_per_node}", f"--node-rank={t.node_rank}"]
    if t.nnodes == 1 and not (t.rdzv_endpoint or t.master_addr):
        return [*cmd, "--standalone", "-m", "trainer.rank.worker", str(cfg_path)]
    if t.rdzv_endpoint:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={t.rdzv_endpoint}"]
    else:
        cmd += ["--rdzv-backend=static", f"--master-addr={t.master_addr}"]
        cmd.append(f"--master-port={t.master_port}")
    if t.rdzv_id:
        cmd.append(f"--rdzv-id={t.rdzv_id}")
    return [*cmd, "-m", "trainer.rank.worker", str(cfg_path)]


def torchrun_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without torchrun's ``PET_*`` and ``TORCHELASTIC_*`` variables: what the
    torchrun agent (and so its workers) runs with. ``PET_*`` were read once, by
    :func:`cluster_torchrun`; left in, torchrun would read them again as its flags'
    defaults, behind the flags we did not pass (or a switch such as ``PET_STANDALONE``).
    ``TORCHELASTIC_*`` are an enclosing elastic agent's (its run id, restart count, error
    file, timer file): our agent sets its own, and an inherited one would make our workers
    write their errors into, or be timed by, another job's files. ``ILAB_NOTIFY``'s URLs
    stay with the launcher, which sends the alerts (docs/alerts.md)."""
    return {k: v for k, v in env.items() if not k.startswith(("PET_", "TORCHELASTIC_", NOTIFY_ENV))}
