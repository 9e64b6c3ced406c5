"""The reader reads a file in blocks and splits each block into lines (journal/read/lines.py,
``Carry.split``): whatever the block size, and however often a caller stops at ``max_bytes``
and reads on, it finds the same records, the same invalid lines (line numbers, offsets,
reasons) and the same place to resume as one read of the whole file."""

from __future__ import annotations

from pathlib import Path

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.read.reader import JournalReader

RECORD = {"v": 1, "seq": 0, "run_id": "r", "attempt": 1, "ts": 1.5, "event": "log", "step": 1}

#: Lines of every kind a reader meets: records (short and long), blanks, JSON that is no
#: record, and text that is no JSON.
LINE = st.one_of(
    st.builds(
        lambda seq, pad: orjson.dumps({**RECORD, "seq": seq, "data": {"note": "x" * pad}}),
        st.integers(0, 99),
        st.integers(0, 300),
    ),
    st.sampled_from([b"", b"   ", b"{not json", b"[1, 2]", b'{"seq": "nine", "event": "log"}']),
)


def _whole(path: Path, final: bool) -> tuple[list, list, int, int, bool]:
    batch = JournalReader(path).read(final=final)
    return batch.records, batch.invalid, batch.offset, batch.line_no, batch.torn_tail


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(LINE, max_size=30),
    tail=st.sampled_from([b"", b'{"v":1,"seq":7', b"x" * 700]),
    chunk=st.integers(1, 900),
    step=st.one_of(st.none(), st.integers(1, 2_000)),
    final=st.booleans(),
)
def test_any_block_size_reads_as_one_read(
    tmp_path: Path, lines: list[bytes], tail: bytes, chunk: int, step: int | None, final: bool
) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines) + tail)
    records, invalid, offset, line_no, torn = _whole(path, final)
    reader = JournalReader(path, chunk_size=chunk)
    got_records, got_invalid = [], []
    while True:
        before = reader.offset
        batch = reader.read(final=final, max_bytes=step)
        got_records += batch.records
        got_invalid += batch.invalid
        if reader.offset == before:
            break
    assert got_records == records
    assert got_invalid == invalid
    assert (reader.offset, reader.line_no) == (offset, line_no)
    assert batch.torn_tail is torn
    assert [r["seq"] for r in records] == [
        orjson.loads(x)["seq"] for x in lines if x[:1] == b"{" and b"note" in x
    ]
