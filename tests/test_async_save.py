"""Asynchronous checkpoints under kill -9 (bounded; ``make torture`` runs the long node-crash
torture with --async-save, the default): a kill while a background write is in flight leaves
nothing a reader takes for a checkpoint, and the relaunch resumes from the newest complete one."""

from __future__ import annotations

import json
import random
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    BIN,
    cli,
    kill_tree,
    records,
    train,
    train_argv,
    train_env,
    wait_for,
)
from trainer.checkpoint.async_save import WRITE_DELAY_ENV

pytestmark = pytest.mark.dist


ON_SAVE_CHECK = """
import json, os, pathlib
path = pathlib.Path(os.environ["ILAB_CHECKPOINT_PATH"])
full = path / "full_state"
complete = (full / "trainer_state.json").is_file() and (full / ".metadata").is_file()
with open(os.environ["SEEN"], "a") as f:
    f.write(json.dumps({"path": str(path), "complete": complete}) + "\\n")
"""


def _complete(path: Path) -> bool:
    full = path / "full_state"
    return (full / "trainer_state.json").exists() and (full / ".metadata").exists()


def _newest_complete(ckpt: Path) -> str | None:
    done = sorted(p for p in (ckpt / "checkpoints").glob("step-*") if _complete(p))
    return str(done[-1]) if done else None


def _begins(ckpt: Path) -> int:
    return sum(r["event"] == "train_begin" for r in records(ckpt))


def _writing(ckpt: Path) -> bool:
    return any((ckpt / "checkpoints").glob(".tmp-step-*"))


def kill_during_background_writes(
    tmp_path: Path, kills: int, seed: int, steps: int = 20
) -> dict[str, int]:
    """``kill -9`` of the whole tree while a background write is in flight (each write made
    to last a second longer), ``kills`` times, relaunching each time, with a watcher whose
    ``--on-save`` checks the checkpoint it is handed; then the run goes on to its end.

    Every launch resumes from the newest complete checkpoint on disk, no ``save`` record
    and no ``step-*`` name is ever an incomplete checkpoint, and the hook sees each saved
    checkpoint, complete. Returns the figures for the reliability table."""
    ckpt, seen, script = tmp_path / "run", tmp_path / "seen.jsonl", tmp_path / "check.py"
    script.write_text(ON_SAVE_CHECK)
    args = ("--max-steps", str(steps), "--save-every", "2", "--keep-last-n", "100")
    env = {**train_env(step_delay=0.05), WRITE_DELAY_ENV: "1.0"}
    watch = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(script), "--name", "check"],
        env={**env, "SEEN": str(seen)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    rng = random.Random(seed)
    resumed, hit = [], 0
    try:
        for attempt in range(1, kills + 1):
            resumed.append(_newest_complete(ckpt))
            job = subprocess.Popen(
                train_argv(ckpt, *args),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            try:  # this attempt's train_begin: the previous attempt's partial write is gone
                wait_for(
                    lambda a=attempt: _begins(ckpt) >= a, what=f"attempt {attempt}'s train_begin"
                )
                wait_for(lambda: _writing(ckpt), what="a background write")
                wait_for(  # a random moment, then the next one with a write in flight
                    lambda t=time.monotonic() + rng.uniform(0, 1.5): (
                        time.monotonic() > t and _writing(ckpt)
                    ),
                    what="a write in flight",
                )
            finally:
                kill_tree(job.pid)
                job.wait()
            hit += _writing(ckpt)
            for d in (ckpt / "checkpoints").glob("step-*"):
                assert _complete(d), d  # only renamed, complete checkpoints carry the name
        resumed.append(_newest_complete(ckpt))
        final = train(ckpt, *args)
        assert final.returncode == 0, final.stderr[-3000:]
        _, err = watch.communicate(timeout=120)  # it ends with the run
        assert watch.returncode == 0, err[-3000:]
    finally:
        kill_tree(watch.pid)
    recs = records(ckpt)
    begins = [r for r in recs if r["event"] == "train_begin"]
    assert [b["data"]["resumed_from"] for b in begins] == resumed
    saved = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    assert all(_complete(Path(p)) for p in saved)  # no record names a partial write
    hook = [json.loads(line) for line in seen.read_text().splitlines()]
    assert {h["path"] for h in hook} == set(saved)
    assert all(h["complete"] for h in hook)
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
    assert not _writing(ckpt)  # the last partial write was removed at the final start
    return {"kills": kills, "during_a_write": hit, "saves_delivered": len(hook)}


@pytest.mark.extended
def test_kill_9_during_background_writes_resumes_from_the_newest_complete_checkpoint(
    tmp_path: Path,
) -> None:
    figures = kill_during_background_writes(tmp_path, kills=2, seed=1)
    assert figures["during_a_write"] >= 1  # the write outlives the kill by design (1 s)
    logged = "".join(p.read_text() for p in (tmp_path / "run" / "logs").glob("*"))
    assert "a save the previous attempt did not finish" in logged


def _exported(hf: Path) -> tuple[dict[str, torch.Tensor], str]:
    from safetensors.torch import load_file

    return load_file(str(hf / "model.safetensors")), (hf / "config.json").read_text()


@pytest.mark.extended
def test_background_and_later_exports_equal_the_gathered_one(tmp_path: Path) -> None:
    """An asynchronous save's export, made by rank 0 from the written shards off the training
    path, and ``ilab-journal export`` of a checkpoint saved without one, hold exactly what a
    synchronous save gathers from the ranks (``--export-every``, ``--export-dtype`` kept)."""
    args = ("--max-steps", "6", "--save-every", "2", "--keep-last-n", "5", "--export-dtype", "bf16")
    gathered, later = tmp_path / "sync", tmp_path / "async"
    for ckpt, extra in ((gathered, ("--no-async-save",)), (later, ("--export-every", "4"))):
        proc = train(ckpt, *args, *extra)
        assert proc.returncode == 0, proc.stderr[-3000:]
    saves = {r["step"]: r["data"] for r in records(later) if r["event"] == "save"}
    assert {s: d["kind"] for s, d in saves.items()} == {
        2: ["full_state"],
        4: ["full_state", "hf"],
        6: ["full_state", "hf"],  # the final save always exports
    }
    assert saves[2]["export_skipped"] == "export_every=4"
    step2 = later / "checkpoints" / "step-000002"
    assert not (step2 / "hf").exists()

    out = cli("ilab-journal", "export", str(later), "--step", "2", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(step2 / "hf")
    for step in ("step-000002", "step-000004", "step-000006"):
        want, want_config = _exported(gathered / "checkpoints" / step / "hf")
        got, got_config = _exported(later / "checkpoints" / step / "hf")
        assert got_config == want_config
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), step
        assert {t.dtype for t in got.values()} == {torch.bfloat16}  # --export-dtype
    assert not any((later / "leases").glob("*.json"))  # the export's lease is gone
    console = "".join(p.read_text() for p in (later / "logs").glob("launch-*.log"))
    assert "torch.distributed is disabled" not in console  # torch's noise stays out of it

    again = cli("ilab-journal", "export", str(later), "--step", "2")
    assert again.returncode == 0 and again.stdout.strip().endswith("(already exported)")
    missing = cli("ilab-journal", "export", str(later), "--step", "3")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"ilab-journal export: {later / 'checkpoints' / 'step-000003'}: "
        "no complete checkpoint of step 3"
    ]
