"""ilab-train option errors: one clear line, exit 2, before anything is launched."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cli


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--demo", "--lr", "-1"], "--lr: Input should be greater than 0"),
        (["--demo", "--d-model", "30"], "must be divisible by n_heads"),
        (["--data", "/nonexistent.jsonl"], "training data file /nonexistent.jsonl does not exist"),
        ([], "no training data"),
        (["--demo", "--nnodes", "2"], "needs rdzv_endpoint"),
        (["--demo", "--journal-detail", "loud"], "Invalid value for '--journal-detail'"),
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
