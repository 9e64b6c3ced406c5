"""ilab-train in a Kubernetes pod: node count, node rank and rendezvous from Kubeflow
Trainer v2's PET_* and PyTorchJob's variables, as from SLURM_* (tests/test_slurm.py), and
the one-line errors for values that cannot be used."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.helpers import BIN, records, train_env
from trainer.config import TorchrunArgs
from trainer.launch.cluster_env import cluster_torchrun, torchrun_command, torchrun_env

PET = {
    "PET_NNODES": "4",
    "PET_NPROC_PER_NODE": "8",
    "PET_NODE_RANK": "2",
    "PET_MASTER_ADDR": "ft-node-0-0.ft",
    "PET_MASTER_PORT": "29400",
}
PYTORCHJOB = {
    "MASTER_ADDR": "ft-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "3",
    "RANK": "1",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
}


def test_trainer_v2_pet_variables_give_nodes_rank_processes_and_rendezvous() -> None:
    """A TrainJob's pod: every setting from PET_*, a static rendezvous on the master pod;
    what the user gave wins field by field, their own endpoint replaces the master's."""
    assert cluster_torchrun({}, PET) == {
        "nproc_per_node": 8,
        "nnodes": 4,
        "node_rank": 2,
        "master_addr": "ft-node-0-0.ft",
        "master_port": 29400,
    }
    got = cluster_torchrun({"nproc_per_node": 2, "rdzv_endpoint": "h:1"}, PET)
    assert got == {"nproc_per_node": 2, "nnodes": 4, "node_rank": 2, "rdzv_endpoint": "h:1"}
    # PET_* win over PyTorchJob's (the v1 operator sets both, WORLD_SIZE counting processes)
    both = {**PYTORCHJOB, **PET, "WORLD_SIZE": "32", "RANK": "2"}
    assert cluster_torchrun({}, both)["nnodes"] == 4
    # one node: standalone, as outside any cluster
    assert cluster_torchrun({}, {"PET_NNODES": "1", "PET_NODE_RANK": "0"}) == {
        "nnodes": 1,
        "node_rank": 0,
    }


def test_pytorchjob_variables_count_pods_and_win_over_slurm() -> None:
    """PyTorchJob without PET_*: WORLD_SIZE pods, RANK this pod's node rank, MASTER_ADDR:
    MASTER_PORT the rendezvous; they win over SLURM_*; inside a torchrun worker (LOCAL_RANK)
    or outside a pod the same names change nothing."""
    slurm = {"SLURM_JOB_ID": "9", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0"}
    assert cluster_torchrun({"nproc_per_node": 2}, {**slurm, **PYTORCHJOB}) == {
        "nproc_per_node": 2,
        "nnodes": 3,
        "node_rank": 1,
        "master_addr": "ft-master-0",
        "master_port": 23456,
    }
    assert cluster_torchrun({}, {**PYTORCHJOB, "LOCAL_RANK": "0"}) == {}
    # outside a pod the same names are a shell's set up for torchrun: not node counts
    assert cluster_torchrun({}, {k: v for k, v in PYTORCHJOB.items() if "KUBE" not in k}) == {}
    assert cluster_torchrun({}, {}) == {}


@pytest.mark.parametrize(
    ("env", "given", "says"),
    [
        ({**PET, "PET_NNODES": "1:4"}, {}, "PET_NNODES='1:4' is not a whole number"),
        ({**PET, "PET_NODE_RANK": "4"}, {}, "PET_NODE_RANK=4 is not below PET_NNODES=4"),
        ({**PET, "PET_NPROC_PER_NODE": "gpu"}, {}, "give --nproc-per-node"),
        ({"PET_NNODES": "2", "PET_NODE_RANK": "1"}, {}, "PET_MASTER_ADDR is not set"),
        ({**PYTORCHJOB, "RANK": "5"}, {}, "reads PyTorchJob's WORLD_SIZE as the node count"),
        (PET, {"nnodes": 2}, "node rank 2 (from PET variables or the flags) is not below"),
        ({**PET, "PET_MASTER_PORT": "99999"}, {}, "master port 99999 is not a port"),
    ],
)
def test_unusable_cluster_variables_are_one_line(
    env: dict[str, str], given: dict[str, int], says: str
) -> None:
    with pytest.raises(ValueError, match=r"^[^\n]*$") as err:
        cluster_torchrun(given, env)
    assert says in str(err.value)


def test_ilab_train_says_a_bad_variable_in_one_line_exit_2(tmp_path: Path) -> None:
    """The CLI: the error names the variable, one line, exit 2, before any worker starts."""
    env = {"PATH": "/usr/bin:/bin", "PET_NNODES": "2", "PET_NODE_RANK": "5", "HOME": str(tmp_path)}
    done = subprocess.run(
        [str(BIN / "ilab-train"), "--demo", "--ckpt-dir", str(tmp_path / "run")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "PET_NODE_RANK=5 is not below PET_NNODES=2" in last
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "journal.jsonl").exists()


#: A pod's PET_* that contradict every flag of the run below: torchrun reads each as its
#: flag's default, so any one left to it would change the run (PET_NNODES=2: it waits for
#: a second node for ever).
CONTRADICTING = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "3",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "192.0.2.1",
    "PET_MASTER_PORT": "29400",
    "PET_RDZV_BACKEND": "static",
    "PET_RDZV_ENDPOINT": "192.0.2.1:29400",
    "PET_MAX_RESTARTS": "3",
}


def test_torchrun_gets_every_setting_as_a_flag_and_no_pet_variable(tmp_path: Path) -> None:
    """The agent's command names node count, ranks per node, node rank and rendezvous
    itself, and its environment has no PET_* left for torchrun to read as defaults."""
    cfg = tmp_path / "cfg.json"
    one = torchrun_command(cfg, TorchrunArgs(nproc_per_node=2))
    assert one[one.index("trainer.launch.agent") + 1 : one.index("trainer.rank.worker") - 1] == [
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--standalone",
    ]
    static = torchrun_command(
        cfg, TorchrunArgs(nnodes=2, node_rank=1, master_addr="h", master_port=29400)
    )
    assert {"--nnodes=2", "--node-rank=1", "--rdzv-backend=static"} <= set(static)
    assert {"--master-addr=h", "--master-port=29400"} <= set(static)
    c10d = torchrun_command(cfg, TorchrunArgs(nnodes=2, rdzv_endpoint="h:1", rdzv_id="r"))
    assert {"--rdzv-backend=c10d", "--rdzv-endpoint=h:1", "--rdzv-id=r"} <= set(c10d)
    # an enclosing elastic agent's variables (a launch from inside another torchrun job)
    # are not our agent's: its error file, timer file and restart count stay out
    enclosing = {
        "TORCHELASTIC_ERROR_FILE": "/tmp/other-job/error.json",
        "TORCHELASTIC_ENABLE_FILE_TIMER": "1",
        "TORCHELASTIC_RESTART_COUNT": "3",
    }
    env = torchrun_env(
        {**CONTRADICTING, **enclosing, "PATH": "/bin", "PETS": "2", "OMP_NUM_THREADS": "1"}
    )
    assert env == {"PATH": "/bin", "PETS": "2", "OMP_NUM_THREADS": "1"}


@pytest.mark.extended
@pytest.mark.timeout(300)
def test_flags_win_over_pet_variables_in_a_real_run(tmp_path: Path) -> None:
    """ilab-train --nnodes 1 --nproc-per-node 1 in a pod whose PET_* say 2 nodes of 3
    ranks: one node of one rank trains to the end (before: torchrun took PET_NNODES=2
    behind --standalone and waited for a second node)."""
    ckpt = tmp_path / "run"
    argv = [str(BIN / "ilab-train"), "--demo", "--ckpt-dir", str(ckpt), "--quiet"]
    argv += ["--nnodes", "1", "--node-rank", "0", "--nproc-per-node", "1", "--max-steps", "3"]
    done = subprocess.run(
        argv, env={**train_env(), **CONTRADICTING}, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr
    recs = records(ckpt)
    begin = next(r["data"] for r in recs if r["event"] == "train_begin")
    assert (begin["world_size"], begin["nnodes"]) == (1, 1)
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
