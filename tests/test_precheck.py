"""A backlog checked ahead by a second process (journal/read/precheck.py): the reader loads
what the checker vouched for as JSON arrays, and finds exactly what it finds without one,
whatever the checker does (slow, killed, gone) and whatever the journal holds; the checker
reads the file the reader holds, never outlives its reader nor its parent, and is started
only for a big backlog on two cores or more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.read.lines import MAX_LINE_BYTES
from journal.read.precheck import Precheck, usable_cores, vouchable
from journal.read.reader import JournalReader, ReadBatch, iter_batches
from journal.read.tailing import RotatingReader
from journal.record.events import SCHEMA_VERSION
from tests.helpers import log_payload, wait_for

MiB = 1 << 20


def _record(seq: int, **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "seq": seq,
        "run_id": "r",
        "attempt": 1,
        "ts": 1.5 + seq,
        "event": "log",
        "step": seq,
        "epoch": 0,
        "samples_seen": seq * 8,
        "data": log_payload(seq, loss=1.0 / (seq + 1)),
        **extra,
    }


def _good(first: int, nbytes: int) -> list[bytes]:
    """Valid, complete records from seq ``first``, about ``nbytes`` of them."""
    lines: list[bytes] = []
    size, seq = 0, first
    while size < nbytes:
        lines.append(orjson.dumps(_record(seq)))
        size += len(lines[-1]) + 1
        seq += 1
    return lines


_ENVELOPE = orjson.dumps({k: v for k, v in _record(7).items() if k != "data"})[:-1]

#: Two lines, each invalid alone, that joined with a comma load as one valid record...
PAIR = [_ENVELOPE + b',"data":{"x":[{}', b'{"y":2}]}}']
#: ...and one invalid line that loads as two records in an array.
TWO_IN_ONE = orjson.dumps(_record(8)) + b"," + orjson.dumps(_record(9))

#: One of each line the line path does not take as it loads it.
ODD = {
    "invalid JSON": [b"{not json"],
    "blank": [b""],
    "spaces": [b"   "],
    "wrong type": [orjson.dumps({**_record(3), "step": "three"})],
    "not an object": [b"[1, 2]"],
    "incomplete": [orjson.dumps({"seq": 4, "event": "log", "data": {"loss": 1.0}})],
    "newer version": [orjson.dumps(_record(5, v=SCHEMA_VERSION + 1))],
    "adversarial pair": PAIR,
    "two in one": [TWO_IN_ONE],
}


def test_vouchable_is_what_the_line_path_takes_as_loaded() -> None:
    assert vouchable(_good(0, 2000))
    for what, lines in ODD.items():
        assert not vouchable(lines), what
        assert not vouchable([*_good(0, 500), *lines, *_good(50, 500)]), what
    assert len(orjson.loads(b"[" + b",".join(PAIR) + b"]")) == 1
    assert len(orjson.loads(b"[" + TWO_IN_ONE + b"]")) == 2


def _mixed(path: Path, *, long_line: bool) -> None:
    """Runs of valid records (so that whole chunks can be vouched for) between every kind
    of line the checker must not vouch for, ending in a torn line."""
    lines, seq = _good(0, 600_000), 1000
    for odd in ODD.values():
        lines += [*odd, *_good(seq, 300_000)]
        seq += 1000
    # a writer of a newer format: a run of its records (a reader warns once)
    newer = [orjson.dumps(_record(seq + i, v=SCHEMA_VERSION + 1)) for i in range(700)]
    lines += [*newer, *_good(seq + 1000, 300_000)]
    if long_line:
        lines += [b"x" * (MAX_LINE_BYTES + 1), *_good(seq + 2000, 1_500_000)]
    path.write_bytes(b"\n".join(lines) + b'\n{"v":1,"seq":99')


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mixed") / "journal.jsonl"
    _mixed(path, long_line=True)
    return path


class Counted:
    """A vouched source that counts the chunks it vouched for (so a test knows the array
    path ran)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.yes = inner, 0

    def covers(self, start: int, end: int) -> bool:
        ok = bool(self.inner.covers(start, end))
        self.yes += ok
        return ok

    def reading(self, limit: int) -> None:
        self.inner.reading(limit)


Batches = list[tuple[Any, ...]]


def _row(b: ReadBatch) -> tuple[Any, ...]:
    return (b.records, b.invalid, b.offset, b.line_no, b.torn_tail, b.tail_bytes)


def _batches(reader: Any, *, max_bytes: int | None, final: bool) -> tuple[Batches, list[str]]:
    """Every batch read (what a ReadBatch holds), and the warnings the reader said, until no
    progress (not a ResourceWarning that the GC happens to give meanwhile for a file some
    other test left open)."""
    out: Batches = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        while True:
            before = reader.offset
            out.append(_row(reader.read(final=final, max_bytes=max_bytes)))
            if reader.offset == before:
                break
    return out, [str(w.message) for w in said if not issubclass(w.category, ResourceWarning)]


def _checked(path: Path, **kw: Any) -> Precheck:
    """A checker over all of ``path``, done before the reader starts (it vouched for all it
    could: the test does not race it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        precheck = Precheck(fd, 0, os.fstat(fd).st_size, **kw)
    finally:
        os.close(fd)  # the checker has its own
    wait_for(lambda: not precheck.running, timeout=60, what="the checker to finish")
    return precheck


@pytest.mark.parametrize(
    ("max_bytes", "chunk_size", "final"),
    [(None, 256 << 10, True), (None, 4 * MiB, False), (64 << 10, 4 * MiB, True), (MiB, MiB, False)],
)
def test_same_batches_with_and_without_the_checker(
    mixed: Path, max_bytes: int | None, chunk_size: int, final: bool
) -> None:
    alone = JournalReader(mixed, chunk_size=chunk_size)
    expected = _batches(alone, max_bytes=max_bytes, final=final)
    precheck = _checked(mixed, piece=64 << 10)
    try:
        vouched = Counted(precheck)
        reader = JournalReader(mixed, chunk_size=chunk_size, vouched=vouched)
        assert _batches(reader, max_bytes=max_bytes, final=final) == expected
    finally:
        precheck.close()
    assert vouched.yes > 0  # the array path ran
    batches, said = expected
    invalid = [bad for b in batches for bad in b[1]]
    # not JSON, a wrong type, no object, the pair, two in one, the long line; the torn tail
    # when final (blank lines are skipped, an incomplete record completed: not invalid)
    assert len(invalid) == 7 + final
    assert len(said) == 1 and "format version" in said[0]


class Oracle:
    """Vouches for exactly the lines :func:`vouchable` takes, as a checker that kept up
    would: ``[start, end)`` when no other line starts in it."""

    def __init__(self, data: bytes) -> None:
        self.bad, at = [], 0
        for line in data.split(b"\n")[:-1]:
            if not vouchable([line]):
                self.bad.append(at)
            at += len(line) + 1

    def covers(self, start: int, end: int) -> bool:
        return not any(start <= b < end for b in self.bad)

    def reading(self, limit: int) -> None:
        pass


ANY_LINE = st.one_of(
    st.builds(
        lambda seq, pad: orjson.dumps(_record(seq, note="x" * pad)),
        st.integers(0, 99),
        st.integers(0, 300),
    ),
    st.sampled_from([line for lines in ODD.values() for line in lines]),
)


@settings(max_examples=80, deadline=None)
@given(
    lines=st.lists(ANY_LINE, max_size=30),
    tail=st.sampled_from([b"", b'{"v":1,"seq":7', b"x" * 700]),
    chunk=st.integers(1, 3000),
    step=st.one_of(st.none(), st.integers(1, 4000)),
    final=st.booleans(),
)
def test_any_chunking_reads_the_same_with_vouched_lines(
    tmp_path_factory: pytest.TempPathFactory,
    lines: list[bytes],
    tail: bytes,
    chunk: int,
    step: int | None,
    final: bool,
) -> None:
    """However the reader's chunks and reads fall (a line carried over from the chunk
    before, a read cut short by ``max_bytes``), lines vouched for come out as the line path
    gives them."""
    path = tmp_path_factory.mktemp("any") / "journal.jsonl"
    data = b"".join(line + b"\n" for line in lines) + tail
    path.write_bytes(data)
    expected = _batches(JournalReader(path, chunk_size=chunk), max_bytes=step, final=final)
    vouched = JournalReader(path, chunk_size=chunk, vouched=Oracle(data))
    assert _batches(vouched, max_bytes=step, final=final) == expected


def test_a_vouched_range_is_not_checked_again(tmp_path: Path) -> None:
    """What makes the checker necessary: lines vouched for are loaded as an array,
    unchecked (here a source that vouches for everything, which no checker would)."""

    class Everything:
        def covers(self, start: int, end: int) -> bool:
            return True

        def reading(self, limit: int) -> None:
            pass

    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join([*PAIR, TWO_IN_ONE]) + b"\n")
    assert len(JournalReader(path).read().invalid) == 3
    batch = JournalReader(path, vouched=Everything()).read()
    assert (len(batch.records), batch.invalid) == (3, [])


def test_the_watchers_reader_finds_the_same_with_a_checker(mixed: Path) -> None:
    """RotatingReader (the watcher's, ilab-journal tail's) starts a checker on a big backlog
    and races it: the same batches as without one."""
    expected = _batches(RotatingReader(mixed, precheck=None), max_bytes=MiB, final=True)
    reader = RotatingReader(mixed, precheck=MiB)
    try:
        first = reader.read(max_bytes=MiB, final=True)
        assert reader.checker is not None
        rest, said = _batches(reader, max_bytes=MiB, final=True)
        assert reader.checker is None  # read past its end: stopped
    finally:
        reader.close()
    assert ([_row(first), *rest], said) == expected


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_killed_checker_changes_nothing(mixed: Path) -> None:
    expected, said = _batches(JournalReader(mixed), max_bytes=256 << 10, final=True)
    fd = os.open(mixed, os.O_RDONLY)
    # 1 KiB pieces: its verdicts fill their pipe long before its end, and it waits there
    # until the reader reads them: it is still at work when killed
    precheck = Precheck(fd, 0, os.fstat(fd).st_size, piece=1024, lead=0)
    os.close(fd)
    try:
        wait_for(lambda: precheck.covers(0, 256 << 10), timeout=60, what="a vouched chunk")
        vouched = Counted(precheck)
        reader = JournalReader(mixed, vouched=vouched)
        first = reader.read(final=True, max_bytes=256 << 10)
        assert vouched.yes == 1
        assert precheck.running
        os.kill(precheck.pid, signal.SIGKILL)
        assert ([_row(first), *_batches(reader, max_bytes=256 << 10, final=True)[0]]) == expected
        wait_for(lambda: precheck.pid not in _children(), timeout=30, what="the reaped checker")
    finally:
        precheck.close()
    assert said


def test_it_vouches_for_the_file_held_not_the_one_at_the_path(tmp_path: Path) -> None:
    """The journal replaced at its path while read: the checker reads the file the reader
    holds. (A checker of the path's file, all valid records, would vouch for the pairs of
    the held one: read as arrays, they would come out as records.)"""
    held = tmp_path / "journal.jsonl"
    lines: list[bytes] = []
    for seq in range(0, 5000, 1000):  # a pair every 3 MiB
        lines += [*_good(seq, 3 * MiB), *PAIR]
    held.write_bytes(b"\n".join(lines) + b"\n")
    expected = _batches(JournalReader(held), max_bytes=MiB, final=True)[0]

    reader = RotatingReader(held, precheck=MiB)  # holds it
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"\n".join(_good(0, held.stat().st_size + MiB)) + b"\n")
    os.replace(other, held)
    try:
        first = reader.read(final=True, max_bytes=MiB)  # starts the checker
        checker = reader.checker
        assert checker is not None
        wait_for(lambda: not checker.running, timeout=60, what="the checker to finish")
        vouched = reader.reader.vouched = Counted(checker)
        rest, _ = _batches(reader, max_bytes=MiB, final=True)
        assert [_row(first), *rest] == expected
        assert vouched.yes > 0
    finally:
        reader.close()


def test_a_whole_scan_is_checked_ahead_of_the_file_it_began_with(tmp_path: Path) -> None:
    """iter_batches over a whole big journal (stats, validate, a backtest's timeline): a
    checker runs ahead, the batches are those of a scan without one and come from the file
    held when the scan began, also once another replaces it at the path; the checker and
    the held file end with the scan, read to its end or left part way."""
    held = tmp_path / "journal.jsonl"
    lines: list[bytes] = []
    for seq in range(0, 7000, 1000):  # 18 MiB (a checker from 16), a pair every 3 MiB
        lines += [*_good(seq, 3 * MiB), *PAIR]
    held.write_bytes(b"\n".join(lines) + b"\n")
    expected = _batches(JournalReader(held), max_bytes=MiB, final=True)[0][:-1]
    fds, children = _fds(), _children()
    scan = iter_batches(held, max_bytes=MiB)
    first = next(scan)
    (checker,) = _children() - children
    other = tmp_path / "other.jsonl"
    other.write_bytes(b"\n".join(_good(0, held.stat().st_size + MiB)) + b"\n")
    os.replace(other, held)
    wait_for(lambda: checker not in _children(), timeout=60, what="the checker to finish")
    assert [_row(first), *map(_row, scan)] == expected
    assert (_fds(), _children()) == (fds, children)
    scan = iter_batches(held, max_bytes=MiB)  # left part way
    next(scan)
    assert _children() != children
    scan.close()
    assert (_fds(), _children()) == (fds, children)


def test_no_checker_outlives_its_reader(mixed: Path) -> None:
    fds, children = _fds(), _children()
    # closed mid-way
    reader = RotatingReader(mixed, precheck=MiB)
    reader.read(max_bytes=64 << 10)
    assert reader.checker is not None
    pid = reader.checker.pid
    assert pid in _children()
    reader.close()
    assert reader.checker is None
    assert pid not in _children()  # killed and reaped: no zombie
    # read to the end
    reader = RotatingReader(mixed, precheck=MiB)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reader.read(max_bytes=64 << 10)
        assert reader.checker is not None
        pid = reader.checker.pid
        _batches(reader, max_bytes=4 * MiB, final=True)
    assert reader.checker is None
    assert pid not in _children()
    reader.close()
    assert (_fds(), _children()) == (fds, children)  # no pipe, no descriptor left


def test_a_journal_truncated_in_place_stops_its_checker(tmp_path: Path) -> None:
    """What it vouched for was in the file before; the file read again from byte 0 gets a
    checker of its own when its backlog is big."""
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(_good(0, 4 * MiB)) + b"\n")
    reader = RotatingReader(path, precheck=MiB)
    try:
        reader.read(max_bytes=MiB)
        checker = reader.checker
        assert checker is not None
        fresh = b"\n".join(_good(5000, 3 * MiB)) + b"\n"
        with path.open("r+b") as f:  # copytruncate's truncation, then a new writer
            f.truncate(0)
            f.write(fresh)
        assert reader.check() == "truncated"
        assert reader.checker is None and checker.pid not in _children()
        expected = _batches(JournalReader(path), max_bytes=MiB, final=True)
        assert _batches(reader, max_bytes=MiB, final=True) == expected
    finally:
        reader.close()


def test_a_small_backlog_gets_no_checker(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(_good(0, 2 * MiB)) + b"\n")
    children = _children()
    reader = RotatingReader(path)  # 16 MiB and up
    assert reader.read(max_bytes=MiB).records
    assert reader.checker is None and _children() == children
    reader.close()


def test_one_checker_per_spare_core(mixed: Path) -> None:
    """Readers of big backlogs at once (a page server following many runs) get one checker
    per core beyond the first; once it is done, the next reader gets one."""
    spare = usable_cores() - 1
    readers = [RotatingReader(mixed, precheck=MiB) for _ in range(spare + 2)]
    try:
        for reader in readers:
            reader.read(max_bytes=64 << 10)
        assert sum(r.checker is not None for r in readers) == spare
        for reader in readers:
            reader.close()
        late = RotatingReader(mixed, precheck=MiB)
        readers.append(late)
        late.read(max_bytes=64 << 10)
        assert late.checker is not None
    finally:
        for reader in readers:
            reader.close()


ONE_CORE = """
import os, sys
import psutil
from journal.read.tailing import RotatingReader
os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
reader = RotatingReader(sys.argv[1], precheck=1)
assert reader.read(max_bytes=1 << 20).records
print(reader.checker, len(psutil.Process().children()))
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity here")
def test_one_core_gets_no_checker(mixed: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", ONE_CORE, str(mixed)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "0"]


ORPHAN = """
import os, sys, time
from journal.read.precheck import Precheck
fd = os.open(sys.argv[1], os.O_RDONLY)
checker = Precheck(fd, 0, os.fstat(fd).st_size)
deadline = time.monotonic() + 60
while not checker.covers(0, 1 << 20) and time.monotonic() < deadline:  # past the records
    time.sleep(0.01)
print(checker.pid, flush=True)
sys.stdin.read()
"""


def test_a_checker_ends_when_its_parent_dies(tmp_path: Path) -> None:
    """Even deep in a line that takes minutes to go through (64 GiB of NUL bytes, a sparse
    file): it looks for its parent at every piece."""
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(_good(0, MiB)) + b"\n")
    os.truncate(path, 64 << 30)
    parent = subprocess.Popen(
        [sys.executable, "-c", ORPHAN, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        checker = psutil.Process(int(parent.stdout.readline()))
        parent.kill()
        parent.wait()

        def ended() -> bool:
            try:
                return checker.status() == psutil.STATUS_ZOMBIE  # reaped by whoever adopted it
            except psutil.NoSuchProcess:
                return True

        wait_for(ended, timeout=10, what="the orphaned checker to end")
    finally:
        parent.kill()
        parent.communicate()  # reaped, and its pipes closed


def test_checker_usage_is_one_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "journal.read.precheck", "3", "nine"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("usage:")
