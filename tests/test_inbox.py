"""Files others drop into a run's inboxes (control/, reports/, leases/): a FIFO, a symlink,
an oversized file or a malformed payload is refused, journaled once and moved aside, and
whoever reads the inbox (the trainer's rank 0, `ilab-journal report`, rotation) goes on.

Real files, real FIFOs, the real readers; the trainer's side runs in-process here (the same
ControlPoller and ReportInbox its rank 0 uses); tests/test_torture_runs.py plants the same
files beside a real 2-rank run."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from journal import JournalWriter, read_all, send_command
from journal.channels.reports import ingest, pending
from journal.checkpoints import leases
from tests.helpers import cli, make_checkpoint
from trainer.steering.control_poller import ControlPoller
from trainer.steering.policy import SAVE
from trainer.steering.report_inbox import ReportInbox

#: What the readers must survive. None of them hangs, exhausts memory or is followed.
BAD_KINDS = ("fifo", "symlink", "oversized", "directory")
OVER_CAP = 64 * 1024 + 1


def plant(directory: Path, name: str, kind: str, body: bytes, elsewhere: Path) -> Path:
    """Put a hostile entry ``name`` into ``directory``; ``body`` is a payload that would be
    valid (and acted on) if the reader followed the symlink or ignored the size cap."""
    directory.mkdir(mode=0o750, parents=True, exist_ok=True)
    path = directory / name
    if kind == "fifo":
        os.mkfifo(path, 0o640)  # no writer ever opens it: a blocking read waits forever
    elif kind == "symlink":
        target = elsewhere / f"target-{directory.name}-{name}"
        target.write_bytes(body)
        path.symlink_to(target)
    elif kind == "oversized":
        path.write_bytes(body + b" " * OVER_CAP)  # still valid JSON, over the 64 KiB cap
    elif kind == "sparse":
        with open(path, "wb") as f:  # 256 MiB that read as zeros; no disk used
            f.truncate(256 << 20)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(body)
    return path


def journal(ckpt: Path) -> list[dict[str, Any]]:
    return read_all(ckpt / "journal.jsonl").records


def refusals(ckpt: Path) -> list[str]:
    """The reasons of the journal's inbox refusals (control records that name no command)."""
    return [
        r["data"]["reason"]
        for r in journal(ckpt)
        if r["event"] == "control" and r["data"]["command"] is None
    ]


def command(name: str, **extra: Any) -> bytes:
    return json.dumps(
        {"command": name, "id": f"planted-{name}", "ts": time.time(), **extra}
    ).encode()


def report_body(**fields: Any) -> bytes:
    payload = {
        "id": "planted",
        "checkpoint_path": None,
        "step": 1,
        "metrics": {"accuracy": 0.99},
        "source": "test",
        "delivery_id": None,
        "reported_at": time.time(),
    }
    return json.dumps({**payload, **fields}).encode()


def poll_once(ckpt: Path, poller: ControlPoller, w: JournalWriter) -> int:
    """One step boundary of rank 0: read the control dir, journal what it found."""
    poller.watch.changed = True  # what the watching thread does when the dir changes
    mask = poller.poll()
    poller.journal(lambda event, data: w.append(event, data), step=1)
    return mask


# -- control/ ---------------------------------------------------------------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_bad_control_file_is_refused_once_and_moved_aside(
    ckpt: Path, tmp_path: Path, kind: str
) -> None:
    """A symlinked or oversized `abort` is never applied; a FIFO does not hang the step."""
    name = f"{kind}.json"
    plant(ckpt / "control", name, kind, command("abort"), tmp_path)
    good = send_command(ckpt, "save", reason="fine")
    poller = ControlPoller(ckpt, set())
    with JournalWriter(ckpt) as w:
        assert poll_once(ckpt, poller, w) == SAVE  # the good command only
        assert poll_once(ckpt, poller, w) == 0  # nothing new: nothing journaled again
    assert os.listdir(ckpt / "control" / "rejected") == [name]
    assert not (ckpt / "control" / name).exists() and not (ckpt / "control" / name).is_symlink()
    applied = [r["data"] for r in journal(ckpt) if r["data"].get("accepted")]
    assert [(a["command"], a["id"]) for a in applied] == [("save", good)]
    rejected = [r["data"] for r in journal(ckpt) if r["data"].get("accepted") is False]
    assert len(rejected) == 1 and rejected[0]["id"] == kind
    assert "control/rejected" in rejected[0]["reason"]


CONTROL_MALFORMED = {
    "command-list": b'{"command": ["stop"]}',  # unhashable: crashed rank 0 with a TypeError
    "command-object": b'{"command": {"stop": 1}}',
    "command-number": b'{"command": 1}',
    "not-an-object": b'["stop"]',
    "invalid-json": b"{not json",
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(CONTROL_MALFORMED))
def test_a_malformed_command_is_refused_and_the_step_goes_on(ckpt: Path, name: str) -> None:
    plant(ckpt / "control", f"{name}.json", "file", CONTROL_MALFORMED[name], ckpt)
    # wrong types beside the command are ignored, not fatal
    (ckpt / "control" / "z.json").write_bytes(command("save", reason=["x"], source={}, id=[1]))
    poller = ControlPoller(ckpt, set())
    with JournalWriter(ckpt) as w:
        assert poll_once(ckpt, poller, w) == SAVE
    assert os.listdir(ckpt / "control" / "rejected") == [f"{name}.json"]
    recs = [r["data"] for r in journal(ckpt) if r["event"] == "control"]
    assert [(r["id"], r["accepted"]) for r in recs] == [(name, False), ("z", True)]


def test_a_long_control_reason_is_truncated_on_both_sides(ckpt: Path) -> None:
    """50 KB of reason in a hand-written file, 1 MB through send_command: the journal gets a
    few KB of each, and both commands apply."""
    cdir = ckpt / "control"
    cdir.mkdir()
    (cdir / "long.json").write_bytes(command("log", reason="r" * 50_000))
    send_command(ckpt, "save", reason="s" * 1_000_000)
    assert all(p.stat().st_size < 64 * 1024 for p in cdir.glob("*.json"))
    poller = ControlPoller(ckpt, set())
    with JournalWriter(ckpt) as w:
        poll_once(ckpt, poller, w)
    recs = [r for r in journal(ckpt) if r["event"] == "control"]
    assert sorted(r["data"]["command"] for r in recs) == ["log", "save"]
    assert all(r["data"]["accepted"] for r in recs)
    for r in recs:
        reason = r["data"]["reason"]
        assert 1000 < len(reason) <= 4096 and "truncated" in reason
    assert max(len(line) for line in (ckpt / "journal.jsonl").read_bytes().splitlines()) < 6000


# -- reports/ ---------------------------------------------------------------------------------

MALFORMED = {
    "metrics-list": report_body(metrics=[1]),  # the AttributeError of the issue
    "metrics-text": report_body(metrics="x"),
    "metric-value-list": report_body(metrics={"accuracy": [1]}),
    "metric-value-nan": b'{"id": "n", "metrics": {"a": NaN}, "reported_at": 1}',
    "step-object": report_body(step={}),
    "checkpoint-number": report_body(checkpoint_path=5),
    "no-id": report_body(id=None),
    "reported-at-text": report_body(reported_at="yesterday"),
    "not-an-object": b"[1, 2, 3]",
    "invalid-json": b"{not json",
    "invalid-utf8": b'{"id": "\xff\xfe", "metrics": {"a": 1}}',
    "empty": b"",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_report_never_stops_the_trainer_and_is_journaled_once(
    ckpt: Path, name: str
) -> None:
    """Rank 0's inbox at two step boundaries: the bad file is refused with its reason and
    moved aside; the good report beside it is journaled."""
    inbox = ckpt / "reports"
    plant(inbox, f"{name}.json", "file", MALFORMED[name], ckpt)
    (inbox / "zz-good.json").write_bytes(report_body(id="zz-good", metrics={"accuracy": 0.5}))
    with JournalWriter(ckpt) as w:
        reports = ReportInbox(ckpt, lambda event, data: w.append(event, data))
        reports.ingest_now()
        reports.ingest_now()
    recs = journal(ckpt)
    assert [r["data"]["id"] for r in recs if r["event"] == "report"] == ["zz-good"]
    reasons = refusals(ckpt)
    assert len(reasons) == 1 and f"reports/{name}.json" in reasons[0], reasons
    assert "reports/rejected" in reasons[0]
    assert os.listdir(inbox / "rejected") == [f"{name}.json"] and pending(ckpt) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", BAD_KINDS)
def test_a_bad_report_file_is_refused_not_followed_and_moved_aside(
    ckpt: Path, tmp_path: Path, kind: str
) -> None:
    plant(ckpt / "reports", f"{kind}.json", kind, report_body(id=kind), tmp_path)
    with JournalWriter(ckpt) as w:
        assert ingest(ckpt, lambda event, data: w.append(event, data)) == 0
    assert [r["event"] for r in journal(ckpt)] == ["control"]
    assert os.listdir(ckpt / "reports" / "rejected") == [f"{kind}.json"]
    assert pending(ckpt) == []


def test_ilab_journal_report_survives_a_malformed_report_left_in_the_inbox(ckpt: Path) -> None:
    """The issue's reproduction: `metrics: [1]` in reports/. Every later `report` used to
    crash on it with a traceback; now the first one refuses it and every one reports."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
    inbox = ckpt / "reports"
    inbox.mkdir()
    (inbox / ".t").write_bytes(b'{"id":"e","metrics":[1]}')
    os.rename(inbox / ".t", inbox / "e.json")
    for value in ("0.5", "0.6"):
        proc = cli("ilab-journal", "report", str(ckpt), "--step", "1", f"accuracy={value}")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert [r["data"]["metrics"] for r in journal(ckpt) if r["event"] == "report"] == [
        {"accuracy": 0.5},
        {"accuracy": 0.6},
    ]
    assert len(refusals(ckpt)) == 1 and "e.json" in refusals(ckpt)[0]
    assert (inbox / "rejected" / "e.json").exists()


def test_a_refused_report_that_cannot_be_moved_aside_is_journaled_once(ckpt: Path) -> None:
    """If reports/rejected cannot be made (here: a file is in its way), the trainer still
    journals the refusal once, not at every step boundary."""
    inbox = ckpt / "reports"
    inbox.mkdir()
    (inbox / "rejected").write_text("in the way")
    (inbox / "bad.json").write_bytes(report_body(metrics=[1]))
    with JournalWriter(ckpt) as w:
        reports = ReportInbox(ckpt, lambda event, data: w.append(event, data))
        for _ in range(3):
            reports.ingest_now()
    assert len(refusals(ckpt)) == 1


def test_a_report_too_large_for_the_inbox_is_refused_when_submitted(ckpt: Path) -> None:
    """10^4 metrics made a 147 KB record; now the reporter is told, and nothing is written."""
    metrics = [f"m{i}=0.5" for i in range(10_000)]
    (ckpt / "journal.jsonl").touch()
    proc = cli("ilab-journal", "report", str(ckpt), "--step", "1", *metrics)
    assert proc.returncode == 2 and "too large" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and pending(ckpt) == []


# -- leases/ ----------------------------------------------------------------------------------


def lease_body(expires: float | None) -> bytes:
    return json.dumps(
        {"id": "x", "checkpoint": "step-000001", "holder": "h", "expires": expires, "ttl": 60}
    ).encode()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("kind", [*BAD_KINDS, "null-expires", "far-future", "invalid-json"])
def test_a_bad_lease_file_pins_nothing_and_is_moved_aside(
    ckpt: Path, tmp_path: Path, kind: str
) -> None:
    """Rotation's look at the leases: a planted FIFO does not hang it, and a symlinked,
    oversized, never-expiring or unreadable lease keeps no checkpoint forever."""
    name = f"step-000001--{kind}.json"
    body = {
        "null-expires": lease_body(None),
        "far-future": lease_body(1e300),  # what `--ttl 1e300` would have written
        "invalid-json": b"{",
    }.get(kind, lease_body(time.time() + 3600))
    plant(ckpt / "leases", name, kind if kind in BAD_KINDS else "file", body, tmp_path)
    seen: list[dict[str, Any]] = []
    assert leases.leased(ckpt, {"step-000001"}, on_reject=seen.append) == set()
    assert os.listdir(ckpt / "leases" / "rejected") == [name]
    assert len(seen) == 1 and name in seen[0]["reason"] and seen[0]["accepted"] is False
    assert leases.active(ckpt) == []


@pytest.mark.timeout(60)
def test_prune_is_not_hung_by_a_fifo_lease(ckpt: Path) -> None:
    """`ilab-journal prune` over a run whose leases/ holds a FIFO: it removes what the policy
    says instead of waiting forever for a writer."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_last_n": 1}})
        for step in (1, 2, 3):
            make_checkpoint(ckpt, step, w.run_id)
            w.append("save", {"checkpoint_path": str(ckpt / f"checkpoints/step-{step:06d}")})
        w.append("train_end", {"status": "completed"})
    plant(ckpt / "leases", "step-000001--fifo.json", "fifo", b"", ckpt)
    proc = cli("ilab-journal", "prune", str(ckpt), timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in (ckpt / "checkpoints").iterdir()) == ["step-000003"]
