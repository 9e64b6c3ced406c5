"""HF ``transformers.Trainer`` with ``JournalCallback`` under torchrun (2 gloo ranks): the
journal validates, ilab-watch sees every checkpoint, a control ``stop`` stops both ranks at
the same step with a final save, and an exception ends in ``train_end`` failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import cli, launch_bridge_script, pythonpath, records, stop_a_bridge_run

pytestmark = pytest.mark.dist
transformers = pytest.importorskip("transformers")

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time, torch
    from transformers import (AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback,
                              TrainingArguments)
    from trainer.integrations.hf_trainer import JournalCallback

    out, steps, fail_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)
    model = AutoModelForCausalLM.from_config(cfg)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 4 * steps
        def __getitem__(self, i):
            ids = torch.tensor([(i + k) % 128 for k in range(16)])
            return {"input_ids": ids, "labels": ids.clone()}

    class Pace(TrainerCallback):  # test only: slow steps, an optional failure, where it ended
        def on_step_end(self, args, state, control, **kw):
            time.sleep(float(os.environ.get("STEP_DELAY", "0")))
            if state.global_step == fail_at:
                raise RuntimeError(f"boom at step {state.global_step}")
        def on_train_end(self, args, state, control, **kw):
            rank = int(os.environ.get("RANK", "0"))
            open(f"{out}/ended-rank{rank}.json", "w").write(json.dumps(state.global_step))

    args = TrainingArguments(
        output_dir=out, per_device_train_batch_size=2, max_steps=steps, save_steps=3,
        save_strategy="steps", logging_steps=1, report_to=[], use_cpu=True,
        ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True,
        eval_strategy="steps", eval_steps=4,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), eval_dataset=Rows(),
                      callbacks=[JournalCallback(keep_last_n=int(os.environ["KEEP"]) if
                                                 os.environ.get("KEEP") else None), Pace()])
    trainer.train()
    # gloo's thread can abort the interpreter at exit ("terminate called without an active
    # exception"): leave as ilab-train's workers do
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
    """
)


def run_hf(
    tmp_path: Path, steps: int, fail_at: int = -1, delay: float = 0.0, keep: int | None = None
) -> subprocess.Popen[str]:
    return launch_bridge_script(tmp_path, SCRIPT, steps, fail_at, delay, keep)


def test_hf_trainer_journal_validates_and_every_checkpoint_is_delivered(tmp_path: Path) -> None:
    job = run_hf(tmp_path, steps=7)
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    out = tmp_path / "out"
    assert cli("ilab-journal", "validate", str(out)).returncode == 0
    recs = records(out)
    events = [r["event"] for r in recs]
    assert events[0] == "train_begin" and recs[0]["data"]["world_size"] == 2
    assert {"python", "torch", "transformers"} <= set(recs[0]["data"]["versions"])
    for ev in (
        "epoch_begin",
        "step_begin",
        "before_optimizer_step",
        "after_optimizer_step",
        "log",
        "evaluate",
        "step_end",
    ):
        assert ev in events, ev
    assert [r["step"] for r in recs if r["event"] == "step_end"] == list(range(1, 8))
    saves = [r for r in recs if r["event"] == "save"]
    assert [s["step"] for s in saves] == [3, 6, 7]
    assert all(Path(s["data"]["checkpoint_path"], "model.safetensors").is_file() for s in saves)
    assert recs[-1]["event"] == "train_end" and recs[-1]["data"]["status"] == "completed"
    seen = tmp_path / "seen.txt"
    proc = cli(
        "ilab-watch",
        str(out),
        "--replay",
        "--on-save",
        f"sh -c 'echo {{checkpoint_path}} >> {seen}'",
    )
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text().split() == [s["data"]["checkpoint_path"] for s in saves]
    status = json.loads(cli("ilab-journal", "status", str(out), "--json").stdout)
    assert status["state"] == "completed"
    # samples: 2 per rank per step, 2 ranks (was 0 in every envelope and in status)
    assert [r["samples_seen"] for r in recs if r["event"] == "step_end"] == [
        4 * s for s in range(1, 8)
    ]
    assert [s["samples_seen"] for s in saves] == [12, 24, 28]
    assert status["samples_seen"] == 28
    assert "samples 28" in cli("ilab-journal", "status", str(out)).stdout


@pytest.mark.extended
def test_control_stop_stops_both_ranks_at_the_same_step_with_a_save(tmp_path: Path) -> None:
    job = run_hf(tmp_path, steps=200, delay=0.2)
    ended, recs = stop_a_bridge_run(job, tmp_path / "out")
    assert ended < 200
    assert [r for r in recs if r["event"] == "save"][-1]["step"] == ended
    end = recs[-1]
    assert end["data"]["final_checkpoint"].endswith(f"checkpoint-{ended}")


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_an_exception_in_training_ends_the_journal_with_train_end_failed(tmp_path: Path) -> None:
    job = run_hf(tmp_path, steps=10, fail_at=2)
    _, err = job.communicate(timeout=240)
    assert job.returncode != 0
    end = records(tmp_path / "out")[-1]
    assert end["event"] == "train_end" and end["data"]["status"] == "failed", err[-2000:]
    assert "boom at step 2" in end["data"]["reason"]
    assert cli("ilab-journal", "status", str(tmp_path / "out")).returncode == 1


@pytest.mark.extended
def test_rotation_by_the_callback_keeps_leased_checkpoints(tmp_path: Path) -> None:
    """keep_last_n=1 with a lease on checkpoint-3 (an eval still reading it): every other
    older checkpoint goes, each journaled; a replay delivers only what is still on disk."""
    from journal.checkpoints.leases import acquire

    out = tmp_path / "out"
    out.mkdir()
    acquire(out, "checkpoint-3", ttl=600, must_exist=False)
    job = run_hf(tmp_path, steps=10, keep=1)
    _, err = job.communicate(timeout=240)
    assert job.returncode == 0, err[-3000:]
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-3"]
    recs = records(out)
    removed = [
        Path(r["data"]["checkpoint_path"]).name for r in recs if r["event"] == "checkpoint_removed"
    ]
    assert removed == ["checkpoint-6", "checkpoint-9"]
    seen = tmp_path / "seen.txt"
    proc = cli("ilab-watch", str(out), "--replay", "--on-save", f"sh -c 'echo {{step}} >> {seen}'")
    assert proc.returncode == 0, proc.stderr
    assert seen.read_text().split() == ["3", "10"]


ONE_PROCESS = textwrap.dedent(
    """
    import sys, torch
    from journal import send_command
    from transformers import (AutoModelForCausalLM, LlamaConfig, Trainer, TrainerCallback,
                              TrainingArguments)
    from trainer.integrations.hf_trainer import JournalCallback

    out = sys.argv[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=32)

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 400
        def __getitem__(self, i):
            ids = torch.tensor([(i + k) % 128 for k in range(16)])
            return {"input_ids": ids, "labels": ids.clone()}

    class Operator(TrainerCallback):  # from another shell in real life
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                send_command(out, "evaluate", command_id="e1")
                send_command(out, "stop", command_id="s1")

    args = TrainingArguments(output_dir=out, per_device_train_batch_size=2, max_steps=200,
                             save_strategy="no", logging_steps=1, report_to=[], use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=AutoModelForCausalLM.from_config(cfg), args=args,
                      train_dataset=Rows(),
                      callbacks=[Operator(), JournalCallback(cannot={"evaluate": "no eval set"})])
    trainer.train()
    """
)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_command_the_run_cannot_do_is_rejected_with_its_reason(tmp_path: Path) -> None:
    """One process, no eval dataset declared: ``evaluate`` is rejected with the reason in
    the journal (HF would raise); the ``stop`` sent with it ends the run, as a command."""
    script = tmp_path / "train.py"
    script.write_text(ONE_PROCESS)
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(script), str(out)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": pythonpath(), "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(out)
    control = {r["data"]["id"]: r["data"] for r in recs if r["event"] == "control"}
    assert control["e1"]["accepted"] is False
    assert control["e1"]["reason"] == "the HF Trainer bridge cannot evaluate: no eval set"
    assert control["s1"]["accepted"] is True
    end = recs[-1]["data"]
    assert (end["status"], end["command"], end["command_id"]) == ("stopped", "stop", "s1")
    assert "rejected: the HF Trainer bridge cannot evaluate" in proc.stderr
