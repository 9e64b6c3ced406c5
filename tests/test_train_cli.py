"""ilab-train option errors: one clear line, exit 2, before anything is launched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import cli, records, train_env
from trainer.config import TrainingArgs, WorkerConfig


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--demo", "--lr", "-1"], "--lr: Input should be greater than 0"),
        (["--demo", "--d-model", "30"], "must be divisible by n_heads"),
        (["--data", "/nonexistent.jsonl"], "training data file /nonexistent.jsonl does not exist"),
        ([], "no training data"),
        (["--demo", "--nnodes", "2"], "needs rdzv_endpoint"),
        (["--demo", "--journal-detail", "loud"], "Invalid value for '--journal-detail'"),
        (["--demo", "--keep-best", "accuracy"], "--keep-best: 'accuracy': expected METRIC:max"),
    ],
)
def test_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    proc = cli("ilab-train", "--ckpt-dir", str(tmp_path / "run"), *args, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was launched


def test_bad_config_files(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "c.yaml"
    bad_yaml.write_text("lr: [1,\n")
    proc = cli("ilab-train", "--config", str(bad_yaml), "--ckpt-dir", str(tmp_path / "r"))
    assert proc.returncode == 2 and "not valid yaml" in proc.stderr
    unknown = tmp_path / "c.json"
    unknown.write_text('{"demo": true, "learning_rate": 0.1}')
    proc = cli("ilab-train", "--config", str(unknown), "--ckpt-dir", str(tmp_path / "r"))
    assert (
        proc.returncode == 2 and "learning_rate" in proc.stderr and "Traceback" not in proc.stderr
    )
    missing = cli("ilab-train", "--demo")
    assert missing.returncode == 2 and "--ckpt-dir is required" in missing.stderr


# The suite hides GPUs from every test not marked gpu (conftest), so these hold everywhere.
@pytest.mark.parametrize("nproc", ["1", "2"])
def test_nccl_without_a_gpu_is_refused_before_launch(tmp_path: Path, nproc: str) -> None:
    proc = cli(
        "ilab-train",
        *("--demo", "--ckpt-dir", str(tmp_path / "run")),
        *("--backend", "nccl", "--nproc-per-node", nproc),
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no worker said anything
    [line] = proc.stderr.splitlines()  # one line, no usage banner
    assert (
        line.startswith("ilab-train: --backend nccl needs CUDA GPUs") and "--backend gloo" in line
    )
    assert not (tmp_path / "run").exists()  # nothing was launched or written


def test_a_failure_while_setting_up_the_worker_is_journaled(tmp_path: Path) -> None:
    """Past the launcher's checks (here: a worker config written by hand), a failure while
    setting up device or process group still ends in train_end failed, not a bare traceback."""
    ckpt = tmp_path / "run"
    cfg = tmp_path / "worker.json"
    args = TrainingArgs(ckpt_dir=ckpt, demo=True, backend="nccl", max_steps=1)
    cfg.write_text(WorkerConfig(args=args).model_dump_json())
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1"),
            *("-m", "trainer.worker", str(cfg)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=train_env(),
    )
    assert proc.returncode != 0
    end = records(ckpt)[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed"
    assert "needs CUDA" in end["data"]["reason"]
