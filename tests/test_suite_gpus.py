"""The suite hides the GPUs from its CPU tests and gives them back to the tests marked gpu,
also under pytest-xdist (``make test`` runs 2 processes): a worker, started with the GPUs
already hidden, must still know the machine's value, or on a GPU machine every gpu test
would skip for want of CUDA."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REAL_GPUS_ENV, ROOT

PROBE = """
import os
from tests import helpers

def test_probe():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""  # hidden from the CPU tests
    assert helpers.REAL_CUDA_VISIBLE_DEVICES == os.environ["EXPECTED_GPUS"]
    assert helpers.real_gpu_env()["CUDA_VISIBLE_DEVICES"] == os.environ["EXPECTED_GPUS"]
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_workers_know_the_machines_gpus(tmp_path: Path, workers: str) -> None:
    probe = tmp_path / "test_probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items() if k != REAL_GPUS_ENV}  # as from a shell
    env.update(CUDA_VISIBLE_DEVICES="3,5", EXPECTED_GPUS="3,5", PYTHONPATH=str(ROOT))
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    argv += ["-n", workers, "--rootdir", str(tmp_path), str(probe)]
    proc = subprocess.run(
        argv,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
