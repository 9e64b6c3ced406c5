"""``ilab-watch --tensorboard``: the journal's metrics read back from the event files with
TensorBoard's own ``EventAccumulator``, live and replayed, with no duplicate point after a
watcher is killed and restarted."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from journal import JournalWriter
from tests.helpers import BIN, cli, kill_tree, wait_for, write_steps

ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_back(logdir: Path) -> tuple[dict[str, list[tuple[int, float]]], dict[str, list[str]]]:
    if not any(logdir.glob("events.out.tfevents.*")):
        return {}, {}
    acc = ea.EventAccumulator(str(logdir), size_guidance={ea.SCALARS: 0, ea.TENSORS: 0})
    acc.Reload()
    tags = acc.Tags()
    scalars = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in tags["scalars"]}
    texts = {
        t: [e.tensor_proto.string_val[0].decode() for e in acc.Tensors(t)] for t in tags["tensors"]
    }
    return scalars, texts


def test_replay_writes_scalars_and_text_at_the_right_steps(tmp_path: Path) -> None:
    ckpt, logdir = tmp_path / "run", tmp_path / "tb"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        write_steps(w, 1, 8)
        w.append(
            "control", {"command": "stop", "id": "c1", "accepted": True, "reason": "enough"}, step=8
        )
        w.append("train_end", {"status": "stopped", "reason": "stop command"}, step=8)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--tensorboard", str(logdir))
    assert proc.returncode == 0, proc.stderr
    scalars, texts = read_back(logdir)
    assert scalars["train/loss"] == [(s, pytest.approx(10.0 / s)) for s in range(1, 9)]
    assert [st for st, _ in scalars["train/tokens_per_s"]] == list(range(1, 9))
    assert scalars["eval/val_loss"] == [(4, pytest.approx(1.25)), (8, pytest.approx(0.625))]
    assert scalars["report/accuracy"] == [(4, pytest.approx(0.04)), (8, pytest.approx(0.08))]
    assert texts["events/save"] == [
        "/c/checkpoints/step-000004 (interval)",
        "/c/checkpoints/step-000008 (interval)",
    ]
    assert texts["events/control"] == ["stop applied: enough"]
    assert texts["events/train_end"] == ["stopped: stop command"]
    # a second replay with a fresh cursor delivers everything again: nothing is duplicated
    proc = cli("ilab-watch", str(ckpt), "--replay", "--tensorboard", str(logdir), "--name", "again")
    assert proc.returncode == 0, proc.stderr
    assert read_back(logdir) == (scalars, texts)


def test_live_export_survives_a_kill_9_without_duplicates(tmp_path: Path) -> None:
    ckpt, logdir = tmp_path / "run", tmp_path / "tb"
    w = JournalWriter(ckpt)
    w.append("train_begin", {"config": {}})
    write_steps(w, 1, 6)
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--tensorboard", str(logdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: len(read_back(logdir)[0].get("train/loss", [])) == 6,
            60,
            "6 loss points written live",
        )
    finally:
        kill_tree(watcher.pid)  # kill -9: the cursor may lag behind what was written
    write_steps(w, 7, 10)
    w.append("train_end", {"status": "completed"}, step=10)
    w.close()
    proc = cli("ilab-watch", str(ckpt), "--tensorboard", str(logdir))  # the restart
    assert proc.returncode == 0, proc.stderr
    scalars, texts = read_back(logdir)
    assert [st for st, _ in scalars["train/loss"]] == list(range(1, 11))
    assert [st for st, _ in scalars["eval/val_loss"]] == [4, 8]
    assert texts["events/train_end"] == ["completed"]


def test_help_names_the_tensorboard_option() -> None:
    proc = cli("ilab-watch", "--help")
    assert "--tensorboard LOGDIR" in proc.stdout
