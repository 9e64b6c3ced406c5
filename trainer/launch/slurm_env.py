"""``ilab-train`` inside a Slurm allocation: the node count, this node's rank and the
rendezvous endpoint come from the ``SLURM_*`` variables, unless given.

``sbatch`` (the batch step, on the first node) and ``srun`` (one task per node) set
``SLURM_JOB_ID``, ``SLURM_JOB_NUM_NODES``, ``SLURM_NODEID`` and ``SLURM_JOB_NODELIST``.
With more than one node, the rendezvous is c10d on the allocation's first host
(``scontrol show hostnames``), port ``MASTER_PORT`` or 29500, id the job id. One node
runs standalone, as outside Slurm. No torch, no Slurm needed to import.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from typing import Any

DEFAULT_RDZV_PORT = 29500
_SET_BY_US = ("nnodes", "node_rank", "rdzv_endpoint", "rdzv_id")


def first_host(nodelist: str) -> str:
    """The first host of a Slurm node list (``node[03-05,9],gpu1`` -> ``node03``), from
    ``scontrol show hostnames`` or, where scontrol cannot answer, parsed here."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=10
        )
        if out.returncode == 0 and out.stdout.split():
            return out.stdout.split()[0]
    except (OSError, subprocess.TimeoutExpired):
        pass
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist.strip())
    if not m:
        raise ValueError(f"SLURM_JOB_NODELIST {nodelist!r}: no host in it")
    return m.group(1) + (m.group(2) or "")


def slurm_torchrun(given: Mapping[str, Any], env: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """``given`` (the torchrun settings the user gave) completed from the ``SLURM_*``
    variables when this runs inside a Slurm job; what the user gave always wins."""
    if "SLURM_JOB_ID" not in env or any(given.get(k) is not None for k in _SET_BY_US):
        return dict(given)
    try:
        nnodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
        node_rank = int(env.get("SLURM_NODEID") or 0)
    except ValueError:
        return dict(given)
    out = dict(given)
    if nnodes <= 1:
        return out
    out.update(nnodes=nnodes, node_rank=node_rank, rdzv_id=f"slurm-{env['SLURM_JOB_ID']}")
    if given.get("master_addr") is None:
        host = first_host(env.get("SLURM_JOB_NODELIST", ""))
        port = int(env.get("MASTER_PORT") or DEFAULT_RDZV_PORT)
        out["rdzv_endpoint"] = f"{host}:{port}"
    return out
