"""JournalWriter: record format, seq continuity, torn tails, file mode, I/O error policies."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from journal import JournalWriteError, JournalWriter, read_all
from journal.record.events import EVENTS
from journal.record.schema import PAYLOAD_MODELS, parse_record
from tests.helpers import log_payload, write_run

SAMPLE_PAYLOADS = {
    "train_begin": {
        "config": {"a": 1},
        "world_size": 2,
        "nnodes": 1,
        "device_type": "cpu",
        "journal_detail": "step",
        "resumed_from": None,
        "total_steps": 5,
        "hostname": "h",
        "pid": 3,
        "versions": {"torch": "2"},
    },
    "log": log_payload(3),
    "evaluate": {"val_loss": 1.5, "val_num_tokens": 100, "duration": 0.2},
    "save": {"checkpoint_path": "/x/step-1", "kind": ["full_state", "hf"], "duration": 1.0},
    "train_end": {
        "status": "failed",
        "reason": "boom",
        "error_type": "ValueError",
        "error_message": "x",
        "traceback": "tb",
    },
    "control": {
        "command": "stop",
        "id": "a1",
        "source": "me",
        "accepted": True,
        "applied_at_step": 4,
    },
    "journal_gap": {"dropped": 2, "first_seq": 1, "last_seq": 2, "error": "ENOSPC"},
    "report": {
        "id": "18c-ab",
        "checkpoint_path": "/ck/checkpoints/step-000040",
        "step": 40,
        "metrics": {"accuracy": 0.8, "judge": "gpt", "passed": True},
        "source": "eval",
        "delivery_id": "r-40-abc",
        "reported_at": 1795316640.5,
    },
    "checkpoint_removed": {
        "checkpoint_path": "/ck/checkpoints/step-000010",
        "reason": "rotation: keep_last_n=3, not the best, not leased",
    },
    "checkpoint_kept": {
        "checkpoint_path": "/ck/lightning_logs/version_0/checkpoints/epoch=0-step=4.ckpt",
        "reason": "leased",
    },
    "job": {
        "id": "19a-cd",
        "job_id": "42",
        "scheduler": "slurm",
        "state": "COMPLETED",
        "node": "n1",
        "exit_code": 0,
        "checkpoint_path": "/ck/checkpoints/step-000040",
        "step": 40,
        "delivery_id": "r-40-abc",
        "reported_at": 1795316640.5,
    },
    "alert": {
        "id": "19a-ef",
        "kind": "failed",
        "step": 40,
        "attempt": 1,
        "message": "train_end failed: RuntimeError: boom",
        "evidence": [],
        "missing": [],
        "condition": None,
        "targets": ["json://127.0.0.1:8080"],
        "run": "/ck",
        "host": "n1",
        "source": "ilab-watch",
        "raised_at": 1795316640.5,
    },
    "alert_told": {
        "id": "19a-ef",
        "told": ["json://127.0.0.1:8080"],
        "failed": [],
        "told_at": 1795316641.5,
    },
}


def test_roundtrip_of_every_event_type(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        for i, ev in enumerate(EVENTS):
            w.append(ev, SAMPLE_PAYLOADS.get(ev, {}), step=i, epoch=1, samples_seen=i * 2)
    batch = read_all(ckpt / "journal.jsonl")
    assert not batch.invalid
    assert [r["event"] for r in batch.records] == list(EVENTS)
    assert [r["seq"] for r in batch.records] == list(range(len(EVENTS)))
    for rec in batch.records:
        parsed = parse_record(rec)
        assert parsed.record.run_id == w.run_id and parsed.record.attempt == 1
        assert rec["data"] == SAMPLE_PAYLOADS.get(rec["event"], {})
        assert type(parsed.payload) is PAYLOAD_MODELS.get(rec["event"], type(parsed.payload))


def test_unknown_events_and_fields_pass_through(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        w.append("my_custom_event", {"anything": [1, 2]})
        w.append("save", {**SAMPLE_PAYLOADS["save"], "extra_field": "kept"})
    recs = read_all(ckpt / "journal.jsonl").records
    assert parse_record(recs[0]).payload.model_dump() == {"anything": [1, 2]}
    assert parse_record(recs[1]).payload.model_dump()["extra_field"] == "kept"


def test_file_mode_and_one_line_per_record(ckpt: Path) -> None:
    old = os.umask(0)
    try:
        with JournalWriter(ckpt / "sub" / "dir") as w:
            w.append("log", log_payload(1))
    finally:
        os.umask(old)
    path = ckpt / "sub" / "dir" / "journal.jsonl"
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    raw = path.read_bytes()
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    assert 250 <= len(raw) <= 500  # the realistic record the benchmark uses


def test_reopen_continues_seq_and_resume_keeps_run_id(ckpt: Path) -> None:
    first = write_run(ckpt, steps=3, end="interrupted")
    resumed = JournalWriter(ckpt, resume=True)
    assert resumed.run_id == first.run_id and resumed.attempt == 2
    assert resumed.seq == first.seq
    resumed.append("train_begin", SAMPLE_PAYLOADS["train_begin"])
    resumed.close()
    fresh = JournalWriter(ckpt, resume=False)
    assert fresh.run_id != first.run_id and fresh.attempt == 1
    fresh.append("train_begin", SAMPLE_PAYLOADS["train_begin"])
    fresh.close()
    seqs = [r["seq"] for r in read_all(ckpt / "journal.jsonl").records]
    assert seqs == list(range(len(seqs)))


def test_torn_final_fragment_is_terminated_on_reopen(ckpt: Path) -> None:
    write_run(ckpt, steps=2, end=None)
    path = ckpt / "journal.jsonl"
    good = read_all(path).records
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":99,"run_id":"x","ev')  # crash mid-write
    with JournalWriter(ckpt, resume=True) as w:
        assert w.seq == good[-1]["seq"] + 1  # the torn record did not count
        w.append("train_end", {"status": "completed"})
    batch = read_all(path)
    assert len(batch.invalid) == 1 and "invalid JSON" in batch.invalid[0].reason
    assert batch.records[-1]["event"] == "train_end"
    assert batch.records[-1]["seq"] == good[-1]["seq"] + 1
    # The existing bytes were not rewritten: append-only.
    assert path.read_bytes().startswith(b"".join(orjson.dumps(r) + b"\n" for r in good))


def test_deferred_records_are_written_in_order_with_the_next_immediate_one(ckpt: Path) -> None:
    w = JournalWriter(ckpt)
    w.append("step_begin", step=1, defer=True)
    w.append("log", log_payload(1), step=1, defer=True)
    path = ckpt / "journal.jsonl"
    assert path.read_bytes() == b""  # nothing written yet
    w.append("step_end", step=1)  # one write carries all three
    assert [r["event"] for r in read_all(path).records] == ["step_begin", "log", "step_end"]
    w.append("step_begin", step=2, defer=True)
    w.append("save", SAMPLE_PAYLOADS["save"], step=2, defer=True)  # durable: never deferred
    assert [r["event"] for r in read_all(path).records][-2:] == ["step_begin", "save"]
    w.append("step_begin", step=3, defer=True)
    w.close()  # close flushes
    recs = read_all(path).records
    assert [r["seq"] for r in recs] == list(range(6)) and recs[-1]["step"] == 3


def test_nan_loss_is_written_as_valid_json(ckpt: Path) -> None:
    with JournalWriter(ckpt) as w:
        w.append("log", {**log_payload(1), "loss": float("nan"), "loss_finite": False})
    rec = read_all(ckpt / "journal.jsonl").records[0]
    assert rec["data"]["loss"] is None and rec["data"]["loss_finite"] is False


def test_dev_full_warn_policy_keeps_going_and_counts(tmp_path: Path) -> None:
    """/dev/full fails every write with ENOSPC: the default policy must never raise."""
    w = JournalWriter("/dev/full")
    for i in range(5):
        assert w.append("log", log_payload(i)) is None
        assert w.append("save", SAMPLE_PAYLOADS["save"]) is None  # fsync path too
    assert w.dropped == 10
    strict = JournalWriter("/dev/full", on_error="raise")
    with pytest.raises(JournalWriteError):
        strict.append("log", log_payload(9))


def test_disk_full_then_recovery_records_the_gap(tmp_path: Path) -> None:
    """A real write failure (RLIMIT_FSIZE -> EFBIG, in a child process), then recovery."""
    script = textwrap.dedent(
        f"""
        import os, resource, signal
        from journal import JournalWriter
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        w = JournalWriter({str(tmp_path)!r})
        for i in range(3):
            assert w.append("step_end", step=i) is not None
        size = os.path.getsize(w.path)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, hard))  # room for a torn piece
        for i in range(3, 7):
            assert w.append("step_end", step=i) is None
        assert w.dropped == 4
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        assert w.append("step_end", step=7) is not None
        w.close()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert "cannot write" in proc.stderr  # warned once
    assert proc.stderr.count("cannot write") == 1
    batch = read_all(tmp_path / "journal.jsonl")
    events = [(r["seq"], r["event"], r["step"]) for r in batch.records]
    assert events[:3] == [(0, "step_end", 0), (1, "step_end", 1), (2, "step_end", 2)]
    # After recovery: the record that went through, then the gap record naming the loss.
    assert events[3] == (7, "step_end", 7)
    gap = batch.records[4]
    assert gap["event"] == "journal_gap" and gap["seq"] == 8
    assert (
        gap["data"]["dropped"] == 4
        and gap["data"]["first_seq"] == 3
        and gap["data"]["last_seq"] == 6
    )
    # The partial record that fit under the limit became exactly one skipped line...
    assert len(batch.invalid) == 1
    # ...which `validate` reports, while the seq hole is explained by the gap record.
    from tests.helpers import cli

    proc = cli("ilab-journal", "validate", str(tmp_path))
    assert proc.returncode == 1
    assert "line 4" in proc.stdout and "missing" not in proc.stdout
