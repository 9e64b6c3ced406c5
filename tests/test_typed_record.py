"""One typed record (journal/record/record.py): a journal line that leaves envelope fields
out (a writer other than ours, a line appended by hand) reads back complete, with the
defaults docs/journal-format.md ("Envelope") documents, through every reader path; only
``validate`` sees it as written, and reports what it lacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from journal.read import reader
from journal.read.checks import records_ok
from journal.read.reader import JournalReader, iter_batches, iter_events
from journal.record.fields import ENVELOPE_TYPES, missing_fields, record_problem
from journal.record.record import ENVELOPE_DEFAULTS, Record, complete
from journal.views.query import find_first, find_last, last_records, records_since_step
from tests.helpers import cli
from watcher.hooks.delivery import undeliverable

#: What a reader fills in, field by field (the table in docs/journal-format.md).
DOCUMENTED = {
    "v": 1,
    "run_id": None,
    "attempt": 1,
    "ts": None,
    "step": 0,
    "epoch": 0,
    "samples_seen": 0,
    "data": {},
}


def full(seq: int, event: str = "log", **data: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "seq": seq,
        "run_id": "r1",
        "attempt": 2,
        "ts": 1.0e9 + seq,
        "event": event,
        "step": 7,
        "epoch": 1,
        "samples_seen": 64,
        "data": data,
    }


#: A line with only what a record cannot do without: its seq and event.
BARE = {"seq": 2, "event": "evaluate"}


def _journal(path: Path, *, bad_line: bool) -> Path:
    """train_begin, log, the bare evaluate, train_end; a line that is no record before the
    bare one when ``bad_line`` (its slice then goes the slow way)."""
    journal = path / "journal.jsonl"
    lines = [
        orjson.dumps(full(0, "train_begin", config={}, total_steps=9)),
        orjson.dumps(full(1, "log", loss=0.5, lr=0.1)),
        *([b"{not json"] if bad_line else []),
        orjson.dumps(BARE),
        orjson.dumps(full(3, "train_end", status="completed")),
    ]
    journal.write_bytes(b"\n".join(lines) + b"\n")
    return journal


def _bare(records: list[Record]) -> Record:
    (rec,) = [r for r in records if r["seq"] == 2]
    return rec


def _assert_completed(rec: Record) -> None:
    assert rec == {**DOCUMENTED, "seq": 2, "event": "evaluate"}


def test_the_documented_defaults_are_the_readers() -> None:
    assert {**ENVELOPE_DEFAULTS, "data": {}} == DOCUMENTED
    assert set(Record.__annotations__) == {"seq", "event", "data", *ENVELOPE_TYPES}
    assert set(ENVELOPE_DEFAULTS) == set(ENVELOPE_TYPES)


@pytest.mark.parametrize("bad_line", [False, True], ids=["fast path", "slow path"])
def test_the_batch_reader_completes_a_record(tmp_path: Path, bad_line: bool) -> None:
    journal = _journal(tmp_path, bad_line=bad_line)
    batch = JournalReader(journal).read(final=True)
    assert len(batch.invalid) == int(bad_line)
    assert [r["seq"] for r in batch.records] == [0, 1, 2, 3]
    _assert_completed(_bare(batch.records))
    assert batch.records[1] == full(1, "log", loss=0.5, lr=0.1)  # a full record: as written
    # iter_batches (stats, show, backtest) the same way
    _assert_completed(_bare([r for b in iter_batches(journal) for r in b.records]))


def test_one_slice_the_fast_way_completes_only_the_incomplete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compiled check sends a valid record that lacks a field to the reader to complete,
    and changes nothing itself (it says what record_problem says of the same object)."""
    slow: list[int] = []
    original = reader._parse_slow
    monkeypatch.setattr(reader, "_parse_slow", lambda *a: (slow.append(1), original(*a))[-1])
    batch = JournalReader(_journal(tmp_path, bad_line=False)).read(final=True)
    assert not slow  # all of it the fast way
    _assert_completed(_bare(batch.records))
    bare, found = dict(BARE), []
    assert records_ok([bare], found) is True and found == [bare] and bare == BARE


def test_validate_reads_it_as_written(tmp_path: Path) -> None:
    journal = _journal(tmp_path, bad_line=False)
    (batch,) = list(iter_batches(journal, as_written=True))
    assert _bare(batch.records) == BARE
    proc = cli("ilab-journal", "validate", str(tmp_path), "--json")
    problems = "\n".join(json.loads(proc.stdout)["problems"])
    assert proc.returncode == 1 and "seq 2" in problems and "Field required" in problems


def test_iter_events_and_the_backward_readers_complete_it(tmp_path: Path) -> None:
    journal = _journal(tmp_path, bad_line=True)
    _assert_completed(_bare(list(iter_events(journal, {"evaluate"}))))
    _assert_completed(_bare(last_records(journal, 2)[0]))
    _assert_completed(_bare(last_records(journal, 1, {"evaluate"})[0]))
    _assert_completed(_bare(records_since_step(journal, 0)[0]))
    found = find_last(journal, "evaluate")
    assert found is not None
    _assert_completed(found)
    first = find_first(journal, "evaluate")
    assert first is not None
    _assert_completed(first)


def test_status_and_show_read_it_complete(tmp_path: Path) -> None:
    journal = tmp_path / "journal.jsonl"
    journal.write_bytes(orjson.dumps(BARE) + b"\n")  # a journal of one bare record
    status = cli("ilab-journal", "status", str(tmp_path), "--json")
    s = json.loads(status.stdout)
    assert (s["run_id"], s["attempt"], s["last_step"], s["epoch"]) == (None, 1, 0, 0), s
    assert s["samples_seen"] == 0 and s["last_ts"] is None and s["invalid_lines"] == 0
    show = cli("ilab-journal", "show", str(tmp_path), "--json")
    assert json.loads(show.stdout) == {**DOCUMENTED, "seq": 2, "event": "evaluate"}
    tail = cli("ilab-journal", "tail", str(tmp_path), "-n", "1")
    assert tail.returncode == 0 and "evaluate" in tail.stdout, tail.stderr


def test_what_no_default_stands_in_for_keeps_a_record_from_hooks() -> None:
    """run_id and ts have no default that means anything (None): a completed record
    without them, or a save without its checkpoint, goes to no hook (fields.py's rule)."""
    bare_save = complete({"seq": 5, "event": "save", "data": {}})
    assert missing_fields(bare_save) == ["run_id", "ts", "data.checkpoint_path"]
    assert undeliverable(bare_save) == "missing run_id, ts, data.checkpoint_path"
    assert undeliverable(complete({**full(6), "step": 3})) is None
    no_epoch = full(7)
    del no_epoch["epoch"]
    assert undeliverable(complete(no_epoch)) is None  # epoch 0: a default that means it
    assert record_problem(full(8)) is None
