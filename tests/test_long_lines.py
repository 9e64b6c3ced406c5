"""Lines too long to be records: read in linear time and bounded memory, reported as
invalid without being loaded, by every reader. The big files are sparse (``truncate``):
they cost no disk and read as NUL bytes, a line with no newline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalReader, JournalWriter, read_all
from journal.read.lines import MAX_LINE_BYTES, LongLine, lines_backwards, read_tail
from journal.read.reader import end_of_complete_lines, iter_events
from tests.helpers import cli, write_run

MB = 1 << 20


def _long_record(seq: int, size: int) -> bytes:
    """A valid record line of about ``size`` bytes (a runaway payload)."""
    rec = {"v": 1, "seq": seq, "run_id": "r", "attempt": 1, "ts": 1.0, "event": "save"}
    return orjson.dumps({**rec, "step": 9, "data": {"blob": "x" * size}}) + b"\n"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.sampled_from([b"", b"a", b"bbbb", b"c" * 9, b"\n", b"\n\n"]), max_size=16),
    st.integers(1, 7),
    st.integers(0, 6),
    st.booleans(),
)
def test_lines_backwards_stands_in_for_lines_over_the_limit(
    tmp_path_factory: pytest.TempPathFactory,
    parts: list[bytes],
    block: int,
    max_line: int,
    include_tail: bool,
) -> None:
    """The same lines and offsets as a forward split, whatever the block size; a line over
    ``max_line`` comes as a LongLine with its length and first bytes instead of its bytes."""
    data = b"".join(parts)
    path = tmp_path_factory.mktemp("b") / "lines.bin"
    path.write_bytes(data)
    pieces, expected, pos = data.split(b"\n"), [], 0
    for piece in pieces:
        expected.append((pos, piece))
        pos += len(piece) + 1
    tail = expected.pop()
    if include_tail and tail[1]:
        expected.append(tail)
    got = list(lines_backwards(path, block=block, include_tail=include_tail, max_line=max_line))
    assert [offset for offset, _ in got] == [offset for offset, _ in expected[::-1]]
    for (_, line), (_, want) in zip(got, expected[::-1], strict=True):
        if len(want) > max_line:
            assert isinstance(line, LongLine) and line == b""
            assert line.length == len(want) and line.head == want[:80]
        else:
            assert line == want and not isinstance(line, LongLine)


def test_a_record_over_the_limit_is_an_invalid_line_for_forward_and_backward_readers(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.jsonl"
    with JournalWriter(path) as w:
        w.append("log", {"loss": 1.0}, step=1)
    with open(path, "ab") as f:
        f.write(_long_record(1, MAX_LINE_BYTES + MB))
    with JournalWriter(path, resume=True) as w:
        w.append("train_end", {"status": "completed"}, step=9)
    batch = read_all(path)
    assert [r["event"] for r in batch.records] == ["log", "train_end"]
    assert len(batch.invalid) == 1 and batch.invalid[0].line_no == 2
    assert "line too long" in batch.invalid[0].reason
    assert batch.invalid[0].snippet.startswith(b'{"v":1,"seq":1')
    assert batch.offset == path.stat().st_size
    # iter_events (query --best, rotation, resume) skips it unread
    assert [r["event"] for r in iter_events(path, {"save", "train_end"})] == ["train_end"]
    # the backward readers meet it and say so
    proc = cli("ilab-journal", "show", str(path), "--last", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x)["event"] for x in proc.stdout.splitlines()] == ["log", "train_end"]
    assert "line too long" in proc.stderr


def test_a_torn_tail_over_the_limit_is_measured_once_while_it_grows(tmp_path: Path) -> None:
    """A follower (tail -f, ilab-watch) polls a journal whose last line keeps growing past
    the limit: each read goes on from where the last one stopped measuring, and the line is
    reported once it ends."""
    path = tmp_path / "journal.jsonl"
    write_run(tmp_path, steps=1)
    start = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b'{"seq": 99, "event": "log", "data": {"x": "')
        f.truncate(start + MAX_LINE_BYTES + MB)
    reader = JournalReader(path)
    first = reader.read()
    assert first.torn_tail and first.tail_bytes == MAX_LINE_BYTES + MB and not first.invalid
    with open(path, "ab") as f:
        f.write(b"more")
    again = reader.read()
    assert again.torn_tail and again.tail_bytes == MAX_LINE_BYTES + MB + 4
    with open(path, "ab") as f:
        f.write(b'"}}\n' + _long_record(100, 10))
    done = reader.read()
    assert [b.reason for b in done.invalid] == [
        f"line too long ({MAX_LINE_BYTES + MB + 4 + 3} bytes, limit 16 MiB): not read"
    ]
    assert [r["seq"] for r in done.records] == [100] and not done.torn_tail
    assert reader.offset == path.stat().st_size
    assert end_of_complete_lines(path) == path.stat().st_size


@pytest.mark.timeout(120)
def test_last_record_reads_a_huge_torn_tail_once(tmp_path: Path) -> None:
    """What every resume, report and prune runs first: the newest record behind a 200 MB
    torn tail (a crash mid-write of garbage). Reading the tail block after block again
    and again took minutes; once is a fraction of a second."""
    path = tmp_path / "journal.jsonl"
    write_run(tmp_path, steps=2)
    end = read_all(path).records[-1]
    os.truncate(path, path.stat().st_size + 200 * MB)
    assert read_tail(path, torn=True).last == end
    assert end_of_complete_lines(path) == path.stat().st_size - 200 * MB


READERS = [
    ["status", "--json"],
    ["status", "--full"],
    ["show"],
    ["show", "--last", "2"],
    ["show", "--since-step", "0"],
    ["tail", "-n", "2"],
    ["query", "--event", "save", "--field", "checkpoint_path"],
    ["query", "--best", "val_loss:min"],
    ["stats", "--json"],
    ["validate", "--json"],
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "tail_mb", [64, pytest.param(2048, marks=pytest.mark.slow, id="2GB")], ids=str
)
def test_every_reader_finishes_on_a_journal_with_a_sparse_tail(
    tmp_path: Path, tail_mb: int
) -> None:
    """A journal extended to gigabytes of NUL bytes (``truncate -s 2G``): every reader
    finishes, in bounded memory, and calls the tail an invalid line that is too long."""
    ckpt = tmp_path / "ckpt"
    write_run(ckpt, steps=5)
    path = ckpt / "journal.jsonl"
    os.truncate(path, path.stat().st_size + tail_mb * MB)
    for args in READERS:
        proc = cli("ilab-journal", args[0], str(ckpt), *args[1:], timeout=300)
        assert "Traceback" not in proc.stderr, (args, proc.stderr)
        out = proc.stdout
        if args[0] == "status":
            assert proc.returncode == 0, (args, proc.stderr)  # completed; the tail is junk
            if "--json" in args:
                assert json.loads(out)["invalid_lines"] == 1
        elif args[0] == "query":
            assert proc.returncode in (0, 1), (args, proc.stderr)
        elif args[0] == "stats":
            assert json.loads(out)["invalid_lines"] == 1
        elif args[0] == "validate":
            problems = json.loads(out)["problems"]
            assert proc.returncode == 1 and any("line too long" in p for p in problems)
        else:
            assert proc.returncode == 0, (args, proc.stderr)
            assert "train_end" in out, args
    show = cli("ilab-journal", "show", str(ckpt), timeout=300)
    assert "line too long" in show.stderr
