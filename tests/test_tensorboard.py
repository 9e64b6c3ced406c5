"""``ilab-watch --tensorboard``: the journal's metrics read back from the event files with
TensorBoard's own ``EventAccumulator``, live and replayed, with no duplicate point after a
watcher is killed and restarted; one TensorBoard run (subdirectory) per journal run, and a
new LOGDIR a new cursor that gets every point."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from journal import JournalWriter
from tests.helpers import BIN, cli, kill_tree, records, wait_for, write_steps

ea = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def tb_runs(logdir: Path) -> dict[str, Path]:
    """The runs TensorBoard shows for ``--logdir LOGDIR`` (its own multiplexer finds them)."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

    mux = EventMultiplexer().AddRunsFromDirectory(str(logdir))
    return {run: logdir / run for run in mux.Runs()}


def the_run(logdir: Path, ckpt: Path) -> Path:
    """The one TensorBoard run of the journal in ``ckpt``: ``LOGDIR/<dir name>-<run id>``."""
    run_id = records(ckpt)[0]["run_id"]
    assert list(tb_runs(logdir)) == [f"{ckpt.name}-{run_id}"]
    return logdir / f"{ckpt.name}-{run_id}"


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
    scalars, texts = read_back(the_run(logdir, ckpt))
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
    assert read_back(the_run(logdir, ckpt)) == (scalars, texts)


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
            lambda: len(read_back(logdir / f"run-{w.run_id}")[0].get("train/loss", [])) == 6,
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
    scalars, texts = read_back(the_run(logdir, ckpt))
    assert [st for st, _ in scalars["train/loss"]] == list(range(1, 11))
    assert [st for st, _ in scalars["eval/val_loss"]] == [4, 8]
    assert texts["events/train_end"] == ["completed"]


def _finished_run(ckpt: Path, last: int) -> None:
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        write_steps(w, 1, last)
        w.append("train_end", {"status": "completed"}, step=last)


def test_another_logdir_is_another_cursor_and_gets_every_point(tmp_path: Path) -> None:
    """``--tensorboard tb2 --replay`` after ``--tensorboard tb1``: the destination is part
    of the cursor's identity, so tb2 gets the whole journal too (it got nothing when the
    cursor ignored LOGDIR); tb1 again is tb1's cursor, done: nothing is written twice."""
    ckpt = tmp_path / "run"
    _finished_run(ckpt, 8)
    names = []
    for logdir in (tmp_path / "tb1", tmp_path / "tb2", tmp_path / "tb1"):
        proc = cli("ilab-watch", str(ckpt), "--replay", "--tensorboard", str(logdir))
        assert proc.returncode == 0, proc.stderr
        names.append(proc.stderr.split("(cursor '")[1].split("'")[0])
        scalars, texts = read_back(the_run(logdir, ckpt))
        assert [st for st, _ in scalars["train/loss"]] == list(range(1, 9)), logdir
        assert [st for st, _ in scalars["eval/val_loss"]] == [4, 8]
        assert texts["events/train_end"] == ["completed"]
    assert names[0] != names[1] and names[0] == names[2]
    assert "done: 0 ok" in proc.stderr  # tb1's cursor again: it had delivered everything


def test_two_runs_in_one_logdir_are_two_tensorboard_runs(tmp_path: Path) -> None:
    """Two run dirs exported to one LOGDIR: each its own subdirectory, which TensorBoard
    shows as its own run, each step once (not one run with every step twice)."""
    logdir = tmp_path / "tb"
    for name, last in (("a", 8), ("b", 12)):
        _finished_run(tmp_path / name, last)
        proc = cli("ilab-watch", str(tmp_path / name), "--replay", "--tensorboard", str(logdir))
        assert proc.returncode == 0, proc.stderr
    runs = tb_runs(logdir)
    assert sorted(runs) == sorted(f"{n}-{records(tmp_path / n)[0]['run_id']}" for n in ("a", "b"))
    for run, path in runs.items():
        last = 8 if run.startswith("a-") else 12
        scalars, _ = read_back(path)
        assert [st for st, _ in scalars["train/loss"]] == list(range(1, last + 1)), run
        assert [st for st, _ in scalars["report/accuracy"]] == list(range(4, last + 1, 4))


def test_help_names_the_tensorboard_option() -> None:
    proc = cli("ilab-watch", "--help")
    assert "--tensorboard LOGDIR" in proc.stdout


def test_a_run_subdirectory_is_one_plain_path_component() -> None:
    """A run id from a hand-written record names no path outside LOGDIR."""
    from watcher.exporters.tensorboard_export import run_subdir

    assert run_subdir("/r/exp 1", "abc123") == "exp-1-abc123"
    for run_id in ("../../etc", "..", "a/b"):
        sub = run_subdir("/r/x", run_id)
        assert "/" not in sub and sub.strip(".") and Path(sub).name == sub
    assert run_subdir("/", "") not in ("", ".", "..")


def test_a_replay_records_every_save_removed_or_not(tmp_path: Path) -> None:
    """An exporter records the run's whole story: a ``--replay`` into a new LOGDIR writes
    every save, those whose checkpoints rotation removed since included (a hook that works
    on a checkpoint skips those)."""
    ckpt, logdir = tmp_path / "run", tmp_path / "tb"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_last_n": 1}})
        for step in (2, 4, 6, 8):
            path = ckpt / f"checkpoints/step-{step:06d}"
            path.mkdir(parents=True)
            w.append("save", {"checkpoint_path": str(path), "kind": ["full_state"]}, step=step)
            if step > 2:  # rotation: the one before goes
                gone = ckpt / f"checkpoints/step-{step - 2:06d}"
                gone.rmdir()
                w.append("checkpoint_removed", {"checkpoint_path": str(gone)}, step=step)
        w.append("train_end", {"status": "completed"}, step=8)
    proc = cli("ilab-watch", str(ckpt), "--replay", "--tensorboard", str(logdir))
    assert proc.returncode == 0, proc.stderr
    texts = read_back(the_run(logdir, ckpt))[1]
    assert [t.split("/")[-1] for t in texts["events/save"]] == [
        f"step-{s:06d}" for s in (2, 4, 6, 8)
    ]
