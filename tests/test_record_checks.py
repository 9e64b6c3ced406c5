"""The scan's compiled record check (journal/read/checks.py) says what ``record_problem``
says, for every field of the rules and every JSON type; and the reader's slices (a bad line
in one slice sends only that slice line by line) keep offsets, line numbers and records."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.read import reader
from journal.read.checks import records_ok
from journal.read.reader import JournalReader
from journal.record.events import END_STATUSES
from journal.record.fields import ENVELOPE_TYPES, PAYLOAD_TYPES, record_problem

#: One value of each JSON type (and the int/float/bool distinctions the rules make).
JSON_VALUES: list[Any] = [None, True, False, 0, 7, -3, 1.5, "x", "", [], [1], {}, {"a": 1}]


def good(event: str = "log", **data: Any) -> dict[str, Any]:
    """A valid record of ``event`` with every envelope field."""
    return {
        "v": 1,
        "seq": 3,
        "run_id": "r",
        "attempt": 1,
        "ts": 1.5,
        "event": event,
        "step": 2,
        "epoch": 0,
        "samples_seen": 16,
        "data": data,
    }


def variants() -> list[Any]:
    """Every envelope and payload field of the rules, absent and with each JSON type; and
    objects that are not records at all."""
    out: list[Any] = [None, 1, "s", [], [good()], good(), {}]
    for name in ("seq", "event", "data", *ENVELOPE_TYPES):
        rec = good()
        del rec[name]
        out.append(rec)
        out += [{**good(), name: value} for value in JSON_VALUES]
    for event, rules in PAYLOAD_TYPES.items():
        out.append(good(event))
        for name in rules:
            out += [good(event, **{name: value}) for value in JSON_VALUES]
    out += [good("train_end", status=s) for s in (*END_STATUSES, "weird", None)]
    out.append(good("evaluate", val_loss=0.5, extra={"x": [1, 2]}))
    return out


def test_the_compiled_check_agrees_with_record_problem() -> None:
    objs = variants()
    disagree = [o for o in objs if records_ok([o]) is not (record_problem(o) is None)]
    assert not disagree
    assert records_ok(objs) is False
    assert records_ok([o for o in objs if record_problem(o) is None]) is True


json_leaf = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=3)
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=4,
)
fields = st.sampled_from(
    [
        "seq",
        "event",
        "data",
        *ENVELOPE_TYPES,
        *sorted({f for rules in PAYLOAD_TYPES.values() for f in rules}),
    ]
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([*PAYLOAD_TYPES, "step_end", "log"]),
            st.dictionaries(fields, json_value, max_size=3),
            st.dictionaries(fields, json_value, max_size=3),
            st.lists(fields, max_size=2),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_batches_of_mutated_records(recs: list[tuple[str, dict, dict, list[str]]]) -> None:
    objs = []
    for event, envelope, payload, dropped in recs:
        rec = {**good(event), **envelope}
        if type(rec.get("data")) is dict:
            rec["data"] = {**rec["data"], **payload}
        for name in dropped:
            rec.pop(name, None)
        objs.append(rec)
    assert records_ok(objs) is all(record_problem(o) is None for o in objs)


def test_slices_keep_offsets_line_numbers_and_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bad lines scattered over many slices: each reported at its own offset and line, every
    good record kept in order, the same as one slice for the whole chunk."""
    lines: list[bytes] = []
    for i in range(400):
        if i % 37 == 5:
            lines.append(b"{not json")
        elif i % 53 == 7:
            lines.append(orjson.dumps({**good(), "seq": "nine"}))
        elif i % 61 == 3:
            lines.append(b"")
        else:
            lines.append(orjson.dumps({**good(), "seq": i}))
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    whole = JournalReader(path).read()
    monkeypatch.setattr(reader, "SLICE_BYTES", 700)  # a few lines a slice
    sliced = JournalReader(path).read()
    assert sliced == whole
    assert [r["seq"] for r in whole.records] == [
        i for i in range(400) if i % 37 != 5 and i % 53 != 7 and i % 61 != 3
    ]
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line) + 1)
    bad = [i for i in range(400) if i % 37 == 5 or (i % 53 == 7 and i % 37 != 5)]
    assert [(b.line_no, b.offset) for b in whole.invalid] == [(i + 1, starts[i]) for i in bad]
    assert (whole.offset, whole.line_no) == (path.stat().st_size, 400)
