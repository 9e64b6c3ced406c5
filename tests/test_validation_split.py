"""``validation_split``: which samples are held out, the same everywhere and every time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT
from trainer.data.rows import DataError
from trainer.data.validation_split import describe, held_out, held_out_count, split


def test_holds_out_the_fraction_rounded_up_and_trains_on_the_rest() -> None:
    samples = [f"s{i}" for i in range(96)]
    train, val = split(samples, 0.1, seed=42)
    assert len(val) == held_out_count(96, 0.1) == 10  # 9.6 rounded up, as datasets does
    assert sorted(train + val) == sorted(samples)
    assert not set(train) & set(val)
    # each side keeps file order (the planner shuffles per epoch itself)
    assert train == sorted(train, key=samples.index) and val == sorted(val, key=samples.index)
    assert held_out_count(5, 0.01) == 1 and held_out_count(5, 0.0) == 0


def test_the_seed_chooses_the_samples() -> None:
    assert held_out(1000, 0.05, 1) == held_out(1000, 0.05, 1)
    assert held_out(1000, 0.05, 1) != held_out(1000, 0.05, 2)


def test_the_same_split_in_every_process() -> None:
    """Every rank computes the split in its own process (and a resume in a later one):
    nothing process-dependent (hash seeds, import order) may change it."""
    code = "import json; from trainer.data.validation_split import held_out; print(json.dumps(held_out(500, 0.05, 7)))"
    outs = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        outs.append(json.loads(proc.stdout))
    assert outs[0] == outs[1] == held_out(500, 0.05, 7)
    assert describe(500, 0.05, 7)["val_samples"] == 25


def test_nothing_left_to_train_on_is_a_data_error() -> None:
    with pytest.raises(DataError, match="none left to train on"):
        held_out(1, 0.5, 0)


def test_start_warnings_know_the_held_out_samples(tmp_path: Path) -> None:
    from trainer.config import TrainingArgs
    from trainer.launch.data_check import DataSummary, start_warnings

    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "x"}\n')

    def warnings(**kw: object) -> list[str]:
        args = TrainingArgs.model_validate({"ckpt_dir": tmp_path, "data_path": data, **kw})
        return start_warnings(args, DataSummary(100, chat=False))

    # eval_every has data to evaluate: no "no validation data" warning
    assert warnings(validation_split=0.1, eval_every=5) == []
    assert "nothing evaluates on it" in warnings(validation_split=0.1)[0]
    # 90 samples train (10 held out): 5 steps of 16, not 6
    assert (
        "of 5 steps (90 samples"
        in warnings(validation_split=0.1, eval_every=5, effective_batch_size=16, max_steps=9)[0]
    )
    with pytest.raises(ValueError, match="validation_split or val_data_path, not both"):
        TrainingArgs.model_validate(
            {
                "ckpt_dir": tmp_path,
                "data_path": data,
                "val_data_path": data,
                "validation_split": 0.1,
            }
        )
