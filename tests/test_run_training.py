"""run_training's embedded watcher and ilab-watch beside a real 2-rank run."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from journal import read_all
from journal.rundir.paths import journal_path
from tests.helpers import BIN, train
from trainer.config import TorchrunArgs, TrainingArgs
from trainer.launch import run_training
from watcher import TrainerCallback

pytestmark = pytest.mark.dist


class Recorder(TrainerCallback):
    """Constructor arguments and state: nothing here could survive serialization into workers."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.saves: list[str] = []
        self.end: dict[str, Any] = {}

    def on_save(self, event: Any, checkpoint_path: str, **data: Any) -> None:
        self.saves.append(self.prefix + checkpoint_path)

    def on_train_end(self, event: Any, **data: Any) -> None:
        self.end = data


@pytest.mark.extended
def test_flat_api_runs_lambda_closure_and_instance_in_the_launching_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    seen: dict[str, list[Any]] = collections.defaultdict(list)
    pid = os.getpid()

    def make_closure(tag: str) -> Any:
        def on_evaluate(event: Any, val_loss: float, **kw: Any) -> None:
            seen[tag].append((event.step, val_loss, os.getpid()))

        return on_evaluate

    def broken(event: Any, **kw: Any) -> None:
        raise RuntimeError("callback bug")

    rec = Recorder("ckpt:")
    args = TrainingArgs(
        ckpt_dir=tmp_path / "run",
        demo=True,
        max_steps=8,
        save_every=4,
        eval_every=4,
        on_save=[
            lambda event, checkpoint_path, **kw: seen["lambda"].append(
                (checkpoint_path, os.getpid())
            ),
            broken,
        ],
        on_evaluate=make_closure("closure"),
        callbacks=[rec],
    )
    result = run_training(args, TorchrunArgs(nproc_per_node=2), echo=False)
    assert result.status == "completed"
    saves = [
        r["data"]["checkpoint_path"]
        for r in read_all(result.journal_path).records
        if r["event"] == "save"
    ]
    assert len(saves) == 2
    assert seen["lambda"] == [(p, pid) for p in saves]
    assert [(s, p) for s, _, p in seen["closure"]] == [(4, pid), (8, pid)]
    assert rec.saves == ["ckpt:" + p for p in saves] and rec.end["status"] == "completed"
    by_name = {(c["callback"].rsplit(".", 1)[-1], c["event"]): c for c in result.callbacks}
    assert by_name[("broken", "save")]["failed"] == 2
    assert "callback bug" in by_name[("broken", "save")]["errors"][0]
    assert by_name[("on_save", "save")]["ok"] == 2


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_ilab_watch_beside_training_survives_a_hanging_callback(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    out = tmp_path / "paths.txt"
    hang = tmp_path / "hang.py"
    hang.write_text("import time; time.sleep(600)\n")
    note = tmp_path / "note.py"
    note.write_text(
        textwrap.dedent(f"""
        import os, sys
        open({str(out)!r}, "a").write(sys.argv[1] + "\\n")
    """)
    )
    watcher = subprocess.Popen(
        [
            str(BIN / "ilab-watch"),
            str(ckpt),
            "--timeout",
            "2",
            "--on-save",
            str(hang),
            "--on-save",
            f"{note} {{checkpoint_path}}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        proc = train(ckpt, "--max-steps", "12", "--save-every", "4")
        assert proc.returncode == 0, proc.stderr[-2000:]
        code = watcher.wait(timeout=120)
    finally:
        watcher.kill()
    saves = [
        r["data"]["checkpoint_path"]
        for r in read_all(journal_path(ckpt)).records
        if r["event"] == "save"
    ]
    assert len(saves) == 3
    assert out.read_text().splitlines() == saves
    assert code == 1  # the hanging hook timed out on every save
    assert watcher.stderr.read().count("timeout") == 3


def test_python_api_example_runs(tmp_path: Path) -> None:
    """The README's Python example, as a file: it must keep working."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "examples" / "python_api.py"),
            "--ckpt-dir",
            str(tmp_path / "api"),
            "--max-steps",
            "10",
            "--target-val-loss",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "status: completed" in proc.stdout
    assert proc.stdout.count("[checkpoint] step") == 5  # save_every=2 over 10 steps
    assert "checkpoints seen by the callback object: 5" in proc.stdout


class LogOrder(TrainerCallback):
    """Sums what its on_log saw; on_train_end notes the count (issue 35: it must be all)."""

    def __init__(self) -> None:
        self.logs: list[int] = []
        self.seen_at_end: int | None = None
        self.late = 0

    def on_log(self, event: Any, **data: Any) -> None:
        if self.seen_at_end is not None:
            self.late += 1
        self.logs.append(event.seq)

    def on_train_end(self, event: Any, **data: Any) -> None:
        self.seen_at_end = len(self.logs)


@pytest.mark.extended
def test_live_two_rank_run_calls_on_train_end_after_every_on_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One object's methods run in journal order live: on_train_end comes after every on_log
    delivered to it, and every log record was delivered or (``log`` is ``latest`` by
    default) coalesced into a newer one, the last log before train_end delivered."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    obj = LogOrder()
    args = TrainingArgs(
        ckpt_dir=tmp_path / "run", demo=True, max_steps=30, log_every=1, callbacks=[obj]
    )
    result = run_training(args, TorchrunArgs(nproc_per_node=2), echo=False)
    assert result.status == "completed"
    logs = [r["seq"] for r in read_all(result.journal_path).records if r["event"] == "log"]
    assert len(logs) == 30
    assert obj.seen_at_end == len(obj.logs) and obj.late == 0
    assert obj.logs == sorted(obj.logs) and set(obj.logs) <= set(logs)
    assert obj.logs[-1] == logs[-1]
    summary = next(c for c in result.callbacks if c["event"] == "log")
    assert summary["ok"] + summary["coalesced"] == len(logs) == len(obj.logs) + summary["coalesced"]
