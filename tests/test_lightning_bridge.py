"""``lightning.pytorch.Trainer`` with ``JournalCallback`` under torchrun (2 gloo ranks, the
Trainer's own DDP strategy): the journal validates, a replay delivers to ``--on-save``
every checkpoint ``ModelCheckpoint`` kept (its deletions are journaled), a control ``stop`` stops both ranks at the same step with a final save, and
an exception ends in ``train_end`` failed. In one process: a leased ``.ckpt`` outlives
``ModelCheckpoint``'s rotation until its lease is released, and a ``dirpath`` outside the
run dir (which no lease covers) is said so at start."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import cli, launch_bridge_script, pythonpath, records, stop_a_bridge_run

pytestmark = pytest.mark.dist
pytest.importorskip("lightning")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time, torch
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from trainer.integrations.lightning import JournalCallback

    out, steps, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rank = int(os.environ.get("RANK", "0"))
    keep = int(os.environ.get("KEEP") or -1)  # ModelCheckpoint's save_top_k

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def training_step(self, batch, i):
            time.sleep(float(os.environ.get("STEP_DELAY", "0")))  # test only: slow steps
            if self.global_step == fail_at:
                raise RuntimeError(f"boom at step {self.global_step}")
            loss = torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
            self.log("train_loss", loss)
            return loss
        def validation_step(self, batch, i):
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Ended(L.Callback):  # where each rank stopped
        def on_train_end(self, trainer, pl_module):
            open(f"{out}/ended-rank{rank}.json", "w").write(json.dumps(trainer.global_step))

    torch.manual_seed(0)
    x = torch.randn(4 * steps, 8)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=steps, default_root_dir=out,
        logger=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, val_check_interval=4, limit_val_batches=2,
        callbacks=[ModelCheckpoint(dirpath=f"{out}/checkpoints", every_n_train_steps=3,
                                   save_top_k=keep, monitor="step", mode="max",
                                   filename="{step}"), JournalCallback(), Ended()],
    )
    trainer.fit(Tiny(), loader, loader)
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


def run_lightning(
    tmp_path: Path, steps: int, fail_at: int = -1, delay: float = 0.0, keep: int | None = None
) -> subprocess.Popen[str]:
    return launch_bridge_script(tmp_path, SCRIPT, steps, fail_at, delay, keep)


def test_lightning_journal_validates_and_a_replay_delivers_what_model_checkpoint_kept(
    tmp_path: Path,
) -> None:
    """save_top_k=1: ModelCheckpoint deletes step=3 once step=6 is saved; the removal is
    journaled, so a replay delivers only the checkpoint still on disk."""
    job = run_lightning(tmp_path, steps=7, keep=1)
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    out = tmp_path / "out"
    assert cli("ilab-journal", "validate", str(out)).returncode == 0
    recs = records(out)
    events = [r["event"] for r in recs]
    assert events[0] == "train_begin" and recs[0]["data"]["world_size"] == 2
    for ev in ("epoch_begin", "step_begin", "before_optimizer_step", "log", "evaluate"):
        assert ev in events, ev
    assert [r["step"] for r in recs if r["event"] == "step_end"] == list(range(1, 8))
    saves = [r for r in recs if r["event"] == "save"]
    assert [s["step"] for s in saves] == [3, 6]
    removed = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "checkpoint_removed"]
    assert removed == [saves[0]["data"]["checkpoint_path"]]
    assert not Path(removed[0]).exists() and Path(saves[1]["data"]["checkpoint_path"]).is_file()
    assert [r["data"]["val_loss"] is not None for r in recs if r["event"] == "evaluate"]
    end = recs[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "completed"
    assert end["data"]["final_checkpoint"] == saves[-1]["data"]["checkpoint_path"]
    seen = tmp_path / "seen.txt"
    proc = cli(
        "ilab-watch",
        str(out),
        "--replay",
        "--on-save",
        f"sh -c 'echo {{checkpoint_path}} >> {seen}'",
    )
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text().split() == [saves[1]["data"]["checkpoint_path"]]


@pytest.mark.extended
def test_control_stop_stops_both_ranks_at_the_same_step_with_a_save(tmp_path: Path) -> None:
    job = run_lightning(tmp_path, steps=200, delay=0.2)
    ended, recs = stop_a_bridge_run(job, tmp_path / "out")
    assert ended < 200
    saves = [r for r in recs if r["event"] == "save"]
    assert saves[-1]["step"] == ended
    assert [s["step"] for s in saves if s["data"]["trigger"] == "control"] == [ended]
    end = recs[-1]
    assert end["data"]["final_checkpoint"] == saves[-1]["data"]["checkpoint_path"]
    assert Path(end["data"]["final_checkpoint"]).is_file()
    assert end["data"]["journal"]["agree_ns_per_step"] > 0  # the all_reduce, measured


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_an_exception_in_training_ends_the_journal_with_train_end_failed(tmp_path: Path) -> None:
    job = run_lightning(tmp_path, steps=10, fail_at=2)
    _, err = job.communicate(timeout=240)
    assert job.returncode != 0
    end = records(tmp_path / "out")[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed", err[-2000:]
    assert "boom at step 2" in end["data"]["reason"]


LEASED_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from journal.checkpoints import leases
    from trainer.integrations.lightning import JournalCallback

    out = sys.argv[1]
    ckpts = f"{out}/lightning_logs/version_0/checkpoints"  # nested, as Lightning's default

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Leaser(L.Callback):  # an eval holding step=2.ckpt from step 3 to step 5
        def on_train_batch_end(self, trainer, *args):
            path = f"{ckpts}/step=2.ckpt"
            if trainer.global_step == 3:
                self.lease = leases.acquire(out, path, ttl=600, holder="test")
            elif trainer.global_step == 5:  # ModelCheckpoint asked to delete it at step 4
                open(f"{out}/there-while-leased", "w").write(str(os.path.isfile(path)))
                leases.release(out, self.lease.id)

    torch.manual_seed(0)
    x = torch.randn(16, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=8, default_root_dir=out, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[JournalCallback(), Leaser(),
                   ModelCheckpoint(dirpath=ckpts, every_n_train_steps=2, save_top_k=1,
                                   monitor="step", mode="max", filename="{step}")],
    )
    trainer.fit(Tiny(), loader)
    """
)


@pytest.mark.extended
def test_a_leased_ckpt_outlives_model_checkpoint_rotation_until_released(tmp_path: Path) -> None:
    """save_top_k=1 (one process): ModelCheckpoint deletes step=2.ckpt at step 4 while it is
    leased; the bridge keeps it (checkpoint_kept), deletes it at the first step end after
    the release (checkpoint_removed), and a watcher leases the .ckpt it delivers. A .ckpt
    an earlier attempt left half deleted is removed at the start."""
    script = tmp_path / "train_leased.py"
    script.write_text(LEASED_SCRIPT)
    out = tmp_path / "out"
    # an earlier attempt died between renaming a .ckpt aside and deleting it
    ckpts = out / "lightning_logs" / "version_0" / "checkpoints"
    ckpts.mkdir(parents=True)
    (ckpts / ".removing-step=0.ckpt").write_bytes(b"half deleted")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "there-while-leased").read_text() == "True"
    assert cli("ilab-journal", "validate", str(out)).returncode == 0
    recs = records(out)
    path = {s["step"]: s["data"]["checkpoint_path"] for s in recs if s["event"] == "save"}
    assert sorted(path) == [2, 4, 6, 8]
    kept = [(r["step"], r["data"]) for r in recs if r["event"] == "checkpoint_kept"]
    assert kept == [(4, {"checkpoint_path": path[2], "reason": "leased"})]
    removed = [
        (r["step"], r["data"]["checkpoint_path"])
        for r in recs
        if r["event"] == "checkpoint_removed"
    ]
    assert removed == [(0, str(ckpts / "step=0.ckpt")), (6, path[2]), (6, path[4]), (8, path[6])]
    assert not (ckpts / ".removing-step=0.ckpt").exists()  # finished at the start
    assert [p for s, p in path.items() if Path(p).exists()] == [path[8]]
    assert not list((out / "leases").glob("*.json"))
    # a watcher leases the .ckpt of each save it delivers while the hook runs
    seen = tmp_path / "seen.txt"
    watch = cli(
        "ilab-watch", str(out), "--replay", "--on-save", f"sh -c 'ls {out}/leases > {seen}'"
    )
    assert watch.returncode == 0, watch.stderr
    assert seen.read_text().startswith("lightning_logs%2Fversion_0%2Fcheckpoints%2Fstep=8.ckpt--")
    assert not list((out / "leases").glob("*.json"))


OUTSIDE_SCRIPT = textwrap.dedent(
    """
    import sys, torch
    import lightning.pytorch as L
    from lightning.pytorch.callbacks import ModelCheckpoint
    from trainer.integrations.lightning import JournalCallback

    out, elsewhere = sys.argv[1], sys.argv[2]

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(8, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2
    )
    each = dict(save_top_k=2, monitor="step", mode="max")  # state keys differ by the interval
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=3, default_root_dir=out, logger=False,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[JournalCallback(),
                   ModelCheckpoint(dirpath=f"{out}/checkpoints", filename="in-{step}",
                                   every_n_train_steps=2, **each),
                   ModelCheckpoint(dirpath=elsewhere, filename="out-{step}",
                                   every_n_train_steps=1, **each)],
    )
    trainer.fit(Tiny(), loader)
    """
)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_model_checkpoint_dir_outside_the_run_dir_is_said_to_be_unprotected(
    tmp_path: Path,
) -> None:
    """Leases cover only the run dir: ModelCheckpoint(dirpath=elsewhere) gets one warning
    line at start and a note in train_begin; the dirpath inside the run dir gets neither."""
    script = tmp_path / "train_outside.py"
    script.write_text(OUTSIDE_SCRIPT)
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()}
    proc = subprocess.run(
        [sys.executable, str(script), str(out), str(elsewhere)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if "leases do not" in ln]
    assert len(said) == 1, said
    assert str(elsewhere) in said[0] and "outside the run dir" in said[0]
    assert str(out / "checkpoints") not in said[0]
    begin = records(out)[0]
    assert begin["event"] == "train_begin"
    [note] = begin["data"]["notes"]
    assert str(elsewhere) in note and "leases do not cover" in note
    assert cli("ilab-journal", "validate", str(out)).returncode == 0


ONE_PROCESS = textwrap.dedent(
    """
    import sys, torch
    import lightning.pytorch as L
    from journal import send_command
    from trainer.integrations.lightning import JournalCallback

    out = sys.argv[1]

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 1)
        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])
        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Operator(L.Callback):  # from another shell in real life
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 2:
                send_command(out, "evaluate", command_id="e1")
                send_command(out, "stop", command_id="s1")

    torch.manual_seed(0)
    x = torch.randn(400, 8)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=2
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=200, default_root_dir=out, logger=False,
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        callbacks=[Operator(), JournalCallback()],
    )
    trainer.fit(Tiny(), loader)
    """
)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_evaluate_which_lightning_cannot_start_is_rejected_with_its_reason(tmp_path: Path) -> None:
    """One process: ``evaluate`` is rejected with the bridge's reason in the journal (not a
    warning on the console only); the ``stop`` sent with it saves and ends the run."""
    script = tmp_path / "train.py"
    script.write_text(ONE_PROCESS)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": pythonpath()},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(out)
    control = {r["data"]["id"]: r["data"] for r in recs if r["event"] == "control"}
    assert control["e1"]["accepted"] is False
    assert control["e1"]["reason"].startswith("the Lightning bridge cannot evaluate: ")
    assert control["s1"]["accepted"] is True
    assert [r["data"]["trigger"] for r in recs if r["event"] == "save"] == ["control"]
    end = recs[-1]["data"]
    assert (end["status"], end["command"], end["command_id"]) == ("stopped", "stop", "s1")
    assert "rejected: the Lightning bridge cannot evaluate" in proc.stderr
