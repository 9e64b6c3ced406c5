"""Reader properties: never crashes, never yields a corrupt record, resumes at the right offset."""

from __future__ import annotations

import copy
from pathlib import Path
from unittest.mock import patch

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalReader, JournalWriter, read_all
from journal.read.lines import lines_backwards
from journal.read.reader import iter_records
from journal.record.fields import record_problem
from tests.helpers import records_st

SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _write(path: Path, recs: list[tuple[str, dict, int]]) -> list[dict]:
    with JournalWriter(path) as w:
        for ev, data, step in recs:
            w.append(ev, data, step=step)
    return read_all(path).records


@settings(SETTINGS, max_examples=5)  # each example reads every byte offset of its journal
@given(recs=records_st)
def test_truncation_at_every_byte_offset(tmp_path_factory, recs) -> None:
    path = tmp_path_factory.mktemp("t") / "journal.jsonl"
    written = _write(path, recs)
    full = path.read_bytes()
    assert len(written) == len(recs)
    ends = [i + 1 for i, b in enumerate(full) if b == ord("\n")]
    cut_path = path.with_name("cut.jsonl")
    for cut in range(len(full) + 1):
        cut_path.write_bytes(full[:cut])
        batch = JournalReader(cut_path).read()
        complete = sum(1 for e in ends if e <= cut)
        assert batch.records == written[:complete]
        assert batch.offset == (ends[complete - 1] if complete else 0)
        assert batch.torn_tail == (cut > batch.offset)
        assert not batch.invalid


@SETTINGS
@given(recs=records_st, splits=st.lists(st.integers(0, 10_000), max_size=8))
def test_incremental_reads_of_a_growing_file_see_each_record_once(
    tmp_path_factory, recs, splits
) -> None:
    path = tmp_path_factory.mktemp("g") / "journal.jsonl"
    written = _write(path, recs)
    full = path.read_bytes()
    growing = path.with_name("growing.jsonl")
    growing.write_bytes(b"")
    reader = JournalReader(growing)
    seen: list[dict] = []
    points = sorted({min(s, len(full)) for s in splits} | {len(full)})
    for p in points:
        growing.write_bytes(full[:p])  # the writer appended up to byte p
        seen.extend(reader.read().records)
        assert reader.offset <= p
    assert seen == written
    assert reader.offset == len(full)


garbage_line = st.one_of(
    st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")),
    st.sampled_from(
        [
            b"123",
            b"[]",
            b'{"seq": -1, "event": "x"}',
            b'{"seq": "1", "event": "x"}',
            b'{"seq": 1}',
            b'{"seq": 1, "event": 2}',
            b'{"seq":1,"event":"x","data":[]}',
            b"null",
            b"\xff\xfe",
            b'{"v":1,"seq":3,"ev',
        ]
    ),
)


@SETTINGS
@given(recs=records_st, garbage=st.lists(st.tuples(st.integers(0, 20), garbage_line), max_size=6))
def test_garbage_lines_are_reported_with_line_numbers_and_skipped(
    tmp_path_factory, recs, garbage
) -> None:
    path = tmp_path_factory.mktemp("x") / "journal.jsonl"
    written = _write(path, recs)
    lines = path.read_bytes().splitlines()
    bad_at: list[int] = []
    for pos, junk in garbage:
        i = min(pos, len(lines))
        lines.insert(i, junk)
    for n, line in enumerate(lines, start=1):
        try:  # a record by the one set of rules (a written payload may break them too)
            ok = record_problem(orjson.loads(line)) is None
        except orjson.JSONDecodeError:
            ok = False
        if not ok and line.strip():
            bad_at.append(n)
    path.write_bytes(b"\n".join(lines) + b"\n")
    batch = read_all(path)
    assert batch.records == written
    assert [b.line_no for b in batch.invalid] == bad_at
    assert batch.offset == path.stat().st_size


def test_finished_file_with_torn_tail_reports_it_once(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    written = _write(path, [("log", {"a": 1}, 1), ("save", {}, 2)])
    with open(path, "ab") as f:
        f.write(b'{"v":1,"seq":2,"ru')
    live = read_all(path, final=False)
    assert live.records == written and live.torn_tail and not live.invalid
    done = read_all(path, final=True)
    assert done.records == written and len(done.invalid) == 1
    assert done.invalid[0].line_no == 3 and "torn" in done.invalid[0].reason


def test_iter_records_spans_chunks_and_huge_lines(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    big = "x" * (5 * 1024 * 1024)  # one line larger than the reader's chunk size
    written = _write(
        path,
        [("log", {"i": i}, i) for i in range(3)]
        + [("save", {"blob": big}, 9)]
        + [("log", {"i": i}, i) for i in range(3)],
    )
    assert list(iter_records(path)) == written


def test_newer_format_version_warns_but_reads(tmp_path: Path) -> None:
    import pytest

    path = tmp_path / "journal.jsonl"
    path.write_bytes(orjson.dumps({"v": 99, "seq": 0, "event": "future", "data": {"x": 1}}) + b"\n")
    with pytest.warns(UserWarning, match="format version 99"):
        batch = read_all(path)
    assert batch.records[0]["event"] == "future"


def test_end_of_complete_lines_ignores_a_torn_tail_and_spans_blocks(tmp_path: Path) -> None:
    from journal.read.reader import end_of_complete_lines

    path = tmp_path / "journal.jsonl"
    assert end_of_complete_lines(path) == 0  # no file yet
    path.write_bytes(b"")
    assert end_of_complete_lines(path) == 0
    body = b"".join(orjson.dumps({"seq": i, "event": "x"}) + b"\n" for i in range(2000))
    path.write_bytes(body + b'{"seq": 2000, "ev')  # torn tail
    assert end_of_complete_lines(path) == len(body)
    path.write_bytes(b"\n" + b"x" * 200_000)  # the only newline is far behind the end
    assert end_of_complete_lines(path) == 1  # spans several 64 KiB blocks


@SETTINGS
@given(
    st.lists(st.sampled_from([b"", b"a", b"bb", b"\n", b"ccc\n", b"\n\n"]), max_size=14),
    st.integers(1, 7),
    st.booleans(),
)
def test_lines_backwards_matches_a_forward_split(
    tmp_path: Path, parts: list[bytes], block: int, include_tail: bool
) -> None:
    """Every line with its offset, newest first, whatever the block size; the torn tail only
    when asked for. Writer start-up, query --last and --from now all rely on it."""
    from journal.read.reader import end_of_complete_lines, lines_backwards

    data = b"".join(parts)
    path = tmp_path / "lines.bin"
    path.write_bytes(data)
    pieces, offsets, pos = data.split(b"\n"), [], 0
    for piece in pieces:
        offsets.append(pos)
        pos += len(piece) + 1
    expected = list(zip(offsets, pieces, strict=True))
    tail = expected.pop()
    if include_tail and tail[1]:
        expected.append(tail)
    got = list(lines_backwards(path, block=block, include_tail=include_tail))
    assert got == expected[::-1]
    assert end_of_complete_lines(path) == data.rfind(b"\n") + 1


@SETTINGS
@given(records_st, st.sets(st.sampled_from(["log", "save", "step_end", "evaluate"]), min_size=1))
def test_iter_events_finds_exactly_the_records_a_full_parse_finds(
    tmp_path: Path, recs: list[tuple[str, dict, int]], events: set[str]
) -> None:
    """The byte prefilter (resume, best checkpoint) never misses or invents a record, even
    when event names also appear inside payloads."""
    from journal.read.reader import iter_events

    path = tmp_path / "events.jsonl"
    path.unlink(missing_ok=True)
    all_records = _write(path, [(ev, {**data, "note": "save log"}, s) for ev, data, s in recs])
    expected = [r for r in all_records if r["event"] in events]
    assert list(iter_events(path, events)) == expected


@SETTINGS
@given(
    records_st,
    st.lists(st.sampled_from([b"{not json", b"[1, 2]", b'{"seq": -1, "event": "x"}']), max_size=3),
    st.integers(1, 6),
    st.sampled_from([None, {"log"}, {"save", "evaluate"}]),
    st.booleans(),
)
def test_last_records_read_backwards_match_a_full_scan(
    tmp_path: Path,
    recs: list[tuple[str, dict, int]],
    garbage: list[bytes],
    n: int,
    events: set[str] | None,
    torn: bool,
) -> None:
    """show --last N and tail -n N read from the end: same records as a full scan, with
    invalid lines and a torn final fragment in the file."""
    from journal.views.query import last_records

    path = tmp_path / "last.jsonl"
    path.unlink(missing_ok=True)
    _write(path, recs)
    with open(path, "ab") as f:
        for g in garbage:
            f.write(g + b"\n")
        if torn:
            f.write(b'{"seq": 99999, "event": "lo')
    full = [r for r in read_all(path).records if events is None or r["event"] in events]
    got, invalid = last_records(path, n, events)
    assert got == full[-n:]
    if events is None and len(full) < n:  # scanned everything: met every invalid line
        assert len(invalid) == len(garbage)
    # from a line boundary in the middle (tail -f starts where the index ends)
    data = path.read_bytes()
    cut = data.find(b"\n", len(data) // 2) + 1
    if cut:
        head = tmp_path / "head.jsonl"
        head.write_bytes(data[:cut])
        expected = [r for r in read_all(head).records if events is None or r["event"] in events]
        assert last_records(path, n, events, end=cut)[0] == expected[-n:]


@SETTINGS
@given(
    st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "train_begin",
                    "log",
                    "evaluate",
                    "save",
                    "report",
                    "train_end",
                    "control",
                    "checkpoint_removed",
                    "garbage",
                    "torn",
                ]
            ),
            st.integers(0, 50),
            st.floats(0, 5),
        ),
        max_size=40,
    )
)
def test_status_from_the_index_equals_a_full_scan(
    tmp_path: Path, plan: list[tuple[str, int, float]]
) -> None:
    """Multiple attempts, reports, removals, invalid lines and torn fragments written
    between the writer's index refreshes: folding the index plus the tail gives exactly
    what reading everything gives."""
    from journal.views import index

    ckpt = tmp_path / "run"
    if ckpt.exists():
        import shutil

        shutil.rmtree(ckpt)
    w = JournalWriter(ckpt)
    ckpt_of = lambda s: f"/c/checkpoints/step-{s:06d}"  # noqa: E731
    for event, step, value in plan:
        if event == "garbage":
            w.close()
            with open(ckpt / "journal.jsonl", "ab") as f:
                f.write(b"{not json\n")
            w = JournalWriter(ckpt, resume=True)
        elif event == "torn":
            w.close()
            with open(ckpt / "journal.jsonl", "ab") as f:
                f.write(b'{"seq": 1, "ev')
            w = JournalWriter(ckpt, resume=True)  # terminates the fragment
        elif event == "train_begin":
            w.append(event, {"config": {"keep_best": "accuracy:max"}, "total_steps": 50}, step=step)
        elif event == "report":
            w.append(
                event,
                {"checkpoint_path": ckpt_of(step), "step": step, "metrics": {"accuracy": value}},
                step=step,
            )
        elif event in ("save", "checkpoint_removed"):
            w.append(event, {"checkpoint_path": ckpt_of(step), "reason": "r"}, step=step)
        elif event == "train_end":
            w.append(event, {"status": "completed"}, step=step)
        else:
            w.append(event, {"loss": value, "val_loss": value, "id": str(step)}, step=step)
    w.close()
    path = ckpt / "journal.jsonl"
    if not path.read_bytes():
        return
    fast, full = index.summarize(path), index.summarize(path, use_index=False)
    assert fast.invalid == full.invalid
    now = 1e12  # both results at the same moment (stale checks)
    a = fast.fold.summary(now=now).to_dict()
    b = full.fold.summary(now=now).to_dict()
    assert a == b
    durable = {"train_begin", "save", "report", "train_end", "control", "checkpoint_removed"}
    if durable & {event for event, _, _ in plan}:
        assert index.load(path) is not None  # the fast path was really taken


@SETTINGS
@given(
    st.lists(
        st.tuples(st.integers(0, 30), st.integers(0, 8), st.booleans()), min_size=1, max_size=5
    ),
    st.integers(0, 40),
    st.sampled_from([None, {"log"}, {"save", "train_begin"}]),
    st.booleans(),
)
def test_records_since_step_read_backwards_match_a_full_scan(
    tmp_path: Path,
    attempts: list[tuple[int, int, bool]],
    since: int,
    events: set[str] | None,
    torn: bool,
) -> None:
    """show --since-step N reads from the end and skips whole attempts below N: the same
    records as a full scan, with resumed attempts that go back in steps (an earlier attempt
    may hold steps past N), invalid lines and a torn final fragment."""
    import shutil

    from journal.views.query import records_since_step

    ckpt = tmp_path / "since"
    shutil.rmtree(ckpt, ignore_errors=True)
    for i, (resume_at, steps, garbage) in enumerate(attempts):
        with JournalWriter(ckpt, resume=i > 0) as w:
            w.append("train_begin", {"config": {}}, step=resume_at)
            for s in range(resume_at + 1, resume_at + steps + 1):
                w.append("step_begin", step=s)
                w.append("log", {"loss": 1.0}, step=s)
                if s % 3 == 0:
                    w.append("save", {"checkpoint_path": f"/c/step-{s:06d}"}, step=s)
        if garbage:
            with open(ckpt / "journal.jsonl", "ab") as f:
                f.write(b"{not json\n")
    path = ckpt / "journal.jsonl"
    if torn:
        with open(path, "ab") as f:
            f.write(b'{"seq": 99999, "event": "lo')
    full = [
        r
        for r in read_all(path).records
        if r["step"] >= since and (events is None or r["event"] in events)
    ]
    got, _ = records_since_step(path, since, events)
    assert got == full
    small = {"block": 37}  # lines and needles across block boundaries
    with patch.dict(lines_backwards.__kwdefaults__, small):
        assert records_since_step(path, since, events)[0] == full


_ENVELOPE = {
    "v": 1,
    "seq": 0,
    "run_id": "r",
    "attempt": 1,
    "ts": 1.0,
    "step": 0,
    "epoch": 0,
    "samples_seen": 0,
}
_PAYLOADS = {
    "log": {
        "loss": 1.0,
        "lr": 0.1,
        "grad_norm": None,
        "elapsed_time": 0.1,
        "tokens_per_s": 1.0,
        "samples_per_s": 1.0,
        "samples_seen": 1,
        "cuda_mem_allocated": None,
        "batch_metrics": {
            "total_samples": 1,
            "total_length": 2,
            "num_loss_counted_tokens": 1,
            "accumulated_loss": 1.0,
            "grad_accum_steps": 1,
            "num_minibatches": 1,
        },
    },
    "save": {"checkpoint_path": "/c", "kind": ["full_state"], "duration": 1.0},
    "train_end": {"status": "completed"},
    "step_end": {"loss": 1.0},
    "future_event": {"anything": [1]},
}


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(_PAYLOADS)),
            st.sampled_from([None, "drop", "null", "string", "negative", "float", "bool", "int"]),
            st.sampled_from(
                ["", "loss", "kind", "status", "batch_metrics", "seq", "step", "ts", "data"]
            ),
        ),
        max_size=30,
    )
)
def test_batch_schema_check_finds_exactly_what_one_record_at_a_time_finds(
    breakage: list[tuple[str, str | None, str]],
) -> None:
    """`validate` checks records in batches; its findings equal parse_record's, record by
    record, for valid records and ones with fields dropped, nulled or of the wrong type."""
    from pydantic import ValidationError

    from journal.record.schema import parse_record
    from journal.views.validate import BatchValidator

    recs = []
    for i, (event, how, key) in enumerate(breakage):
        rec = {
            **_ENVELOPE,
            "seq": i,
            "event": event,
            "data": copy.deepcopy(_PAYLOADS[event]),
        }
        target = rec if key in ("seq", "step", "ts", "data") else rec["data"]
        if how and key:
            if how == "drop":
                target.pop(key, None)
            else:
                target[key] = {
                    "null": None,
                    "string": "x",
                    "negative": -1,
                    "float": 2.0,
                    "bool": True,
                    "int": 1,
                }[how]
        recs.append(rec)
    expected = []
    for i, rec in enumerate(recs):
        try:
            parse_record(rec)
        except ValidationError:
            expected.append(i)
    position = {id(rec): i for i, rec in enumerate(recs)}
    assert [position[id(r)] for r, _ in BatchValidator().problems(recs)] == expected


def _line(kind: str, seq: int, event: str) -> bytes:
    """One journal line of a kind: a valid record, one breaking the schema, a record whose
    seq is out of order, a journal_gap record, or a line that is not a record at all."""
    rec: dict = {**_ENVELOPE, "seq": seq, "event": event, "data": copy.deepcopy(_PAYLOADS[event])}
    if kind == "schema":
        rec["step"] = "x"
    elif kind == "gap_note":
        rec["event"] = "journal_gap"
        rec["data"] = {"dropped": 2, "first_seq": seq - 2, "last_seq": seq - 1, "error": "ENOSPC"}
    elif kind == "garbage":
        return b'{"seq": oops'
    elif kind == "not_record":
        return b"[1, 2]"
    return orjson.dumps(rec)


@settings(SETTINGS, max_examples=10)  # each example starts 2 to 6 scanning processes
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ok"] * 6 + ["schema", "gap_note", "garbage", "not_record"]),
            st.sampled_from([1, 1, 1, 1, 2, 3, 0, -2]),  # seq step: on, gap, repeat, back
            st.sampled_from(sorted(_PAYLOADS)),
        ),
        max_size=40,
    ),
    st.booleans(),
    st.integers(2, 6),
)
def test_validate_and_stats_find_the_same_whatever_the_split(
    tmp_path_factory, lines: list[tuple[str, int, str]], torn: bool, jobs: int
) -> None:
    """`validate` and `stats` of a large journal scan byte ranges in parallel processes:
    validate's report (records, invalid lines, every problem in order, warnings) and the
    stats equal the one-process scan for journals with schema violations, invalid lines,
    seq gaps (explained or not), seqs out of order and a torn tail."""
    from journal.views.stats import journal_stats, scan_stats
    from journal.views.validate import validate_journal

    path = tmp_path_factory.mktemp("v") / "journal.jsonl"
    seq, out = 0, []
    for kind, step, event in lines:
        seq = max(seq + step, 0)
        out.append(_line(kind, seq, event) + b"\n")
    path.write_bytes(b"".join(out) + (b'{"v": 1, "se' if torn else b""))
    one = validate_journal(path, jobs=1)
    split = validate_journal(path, jobs=jobs)
    assert split == one
    if torn:
        assert one.warnings and "torn final line" in one.warnings[-1]
    (whole, bad_whole), (parts, bad_parts) = scan_stats(path), journal_stats(path, jobs)
    assert bad_parts == bad_whole == one.invalid_lines + torn
    # the same, but for floats summed in another order
    assert _flat(parts.to_dict()) == pytest.approx(_flat(whole.to_dict()))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
