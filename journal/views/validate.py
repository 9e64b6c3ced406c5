"""``ilab-journal validate``: every record against the schema, seq order and line integrity."""

from __future__ import annotations

import bisect
import functools
import itertools
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.read.lines import MAX_LINE_BYTES, too_long_reason
from journal.read.parallel import SCAN_BYTES, map_ranges
from journal.read.reader import iter_batches, no_cyclic_gc
from journal.record.events import SCHEMA_VERSION

KEEP_PROBLEMS = 1000  # messages kept (the first ones); all are counted
_SEQ = operator.itemgetter("seq")


@dataclass
class ValidationReport:
    """What a full scan found. ``ok`` when there is no problem (warnings do not count).
    ``problems`` holds the first :data:`KEEP_PROBLEMS` messages, ``problem_count`` counts
    them all (memory stays bounded on a journal that is corrupt throughout)."""

    records: int = 0
    invalid_lines: int = 0
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.problem_count == 0


@dataclass
class _Kept:
    """The first :data:`KEEP_PROBLEMS` items of one kind, and how many there were."""

    items: list[Any] = field(default_factory=list)
    count: int = 0

    def append(self, item: Any) -> None:
        self.count += 1
        if len(self.items) < KEEP_PROBLEMS:
            self.items.append(item)


class BatchValidator:
    """Schema checks of many records per call, several times faster than building models.

    One pydantic-core call checks a whole batch: a list of records tagged by their event, in
    strict mode, against typed-dict schemas derived from the models (no model instances,
    unknown fields ignored rather than copied). Strict accepts a subset of what the models
    accept, so a record it passes is valid. The records it finds fault with (and those of
    events without a schema here, which the models accept as generic) are checked again
    one by one with :func:`journal.record.schema.parse_record`, which has the final word and the
    exact messages.
    """

    def __init__(self) -> None:
        from pydantic_core import SchemaValidator, core_schema

        from journal.record.schema import EVENTS, PAYLOAD_MODELS, RecordModel

        envelope = _as_typed_dict(RecordModel.__pydantic_core_schema__)["fields"]

        def record(data: Any) -> Any:
            # "data" required here: an absent one is checked by parse_record (it defaults
            # to {}, which the event's payload model may reject)
            fields = {**envelope, "data": core_schema.typed_dict_field(data, required=True)}
            return core_schema.typed_dict_schema(fields, extra_behavior="ignore")

        generic = record(core_schema.dict_schema())
        by_event = {
            event: record(_as_typed_dict(PAYLOAD_MODELS[event].__pydantic_core_schema__))
            if event in PAYLOAD_MODELS
            else generic
            for event in EVENTS
        }
        tagged = core_schema.tagged_union_schema(by_event, discriminator="event")
        self._validator = SchemaValidator(core_schema.list_schema(tagged))

    def problems(self, records: Sequence[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str]]:
        """(record, first problem) for each record that breaks the schema, in input order."""
        from pydantic import ValidationError

        from journal.record.schema import parse_record

        try:
            self._validator.validate_python(records, strict=True)
            return []
        except ValidationError as exc:
            at = {e["loc"][0] for e in exc.errors() if e["loc"]}  # positions in the list
        bad = []
        for i in sorted(k for k in at if isinstance(k, int)):
            try:
                parse_record(records[i])
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                bad.append((records[i], f"{loc}: {first['msg']}"))
        return bad


def _check_seqs(
    records: Sequence[Mapping[str, Any]],
    prev_seq: int | None,
    problems: _Kept,
    gaps: list[tuple[int, int]],
) -> int | None:
    """Check that seqs go up by one from ``prev_seq`` (the highest so far); note problems
    and gaps. Returns the new highest seq. A batch without either is checked in C."""
    seqs = list(map(_SEQ, records))
    if not seqs:
        return prev_seq
    first = seqs[0] if prev_seq is None else prev_seq + 1
    consecutive = seqs[0] == first and seqs[-1] - first == len(seqs) - 1
    if consecutive and all(map(operator.lt, seqs, itertools.islice(seqs, 1, None))):
        return seqs[-1]
    for seq in seqs:
        if prev_seq is not None:
            if seq <= prev_seq:
                problems.append(f"seq {seq} after {prev_seq}: not strictly increasing")
            elif seq > prev_seq + 1:
                gaps.append((prev_seq + 1, seq - 1))
        prev_seq = seq if prev_seq is None else max(prev_seq, seq)
    return prev_seq


def _as_typed_dict(schema: Any) -> Any:
    """A pydantic-core schema with every model (nested ones too) turned into a typed dict of
    the same fields and rules; fields with a default become optional keys."""
    from pydantic_core import core_schema

    if isinstance(schema, list):
        return [_as_typed_dict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    if schema.get("type") != "model":
        return {k: _as_typed_dict(v) for k, v in schema.items()}
    fields = {}
    for name, spec in schema["schema"]["fields"].items():
        inner = spec["schema"]
        optional = inner.get("type") == "default"
        fields[name] = core_schema.typed_dict_field(
            _as_typed_dict(inner["schema"] if optional else inner), required=not optional
        )
    return core_schema.typed_dict_schema(fields, extra_behavior="ignore", ref=schema.get("ref"))


@dataclass
class _Part:
    """What the scan of one byte range found; line numbers count from the range's start."""

    records: int = 0
    lines: int = 0
    invalid: _Kept = field(default_factory=_Kept)  # (line number, reason)
    schema: _Kept = field(default_factory=_Kept)
    order: _Kept = field(default_factory=_Kept)
    gaps: list[tuple[int, int]] = field(default_factory=list)
    explained: list[tuple[int, int]] = field(default_factory=list)
    first_seq: int | None = None
    top_seq: int | None = None  # the highest seq
    first_version: Any = None
    torn_tail: bool = False
    tail_bytes: int = 0


@functools.cache  # built once per process (forked workers inherit it)
def _schema() -> BatchValidator:
    return BatchValidator()


def _scan(path: Path, start: int, end: int | None) -> _Part:
    """Scan the lines in ``[start, end)`` (``end`` None: to the end of the file)."""
    schema = _schema()
    part = _Part()
    with no_cyclic_gc():
        # as written: a field a writer left out is a problem here, not a default to fill in
        batches = iter_batches(
            path, final=False, start=start, end=end, max_bytes=SCAN_BYTES, as_written=True
        )
        for batch in batches:
            part.torn_tail, part.tail_bytes = batch.torn_tail, batch.tail_bytes
            part.lines = batch.line_no
            for line in batch.invalid:
                part.invalid.append((line.line_no, line.reason))
            recs = batch.records
            for rec, why in schema.problems(recs):
                part.schema.append(f"seq {rec.get('seq')}: {rec.get('event')}: {why}")
            if recs and part.first_seq is None:
                part.first_seq, part.first_version = recs[0]["seq"], recs[0].get("v")
            part.records += len(recs)
            part.top_seq = _check_seqs(recs, part.top_seq, part.order, part.gaps)
            part.explained += _gap_ranges(recs)
    return part


def _gap_ranges(records: Sequence[Mapping[str, Any]]) -> list[tuple[int, int]]:
    """The seq ranges that ``journal_gap`` records say were lost (rare: looked for in C)."""
    if "journal_gap" not in map(operator.itemgetter("event"), records):
        return []
    gaps = (rec.get("data") or {} for rec in records if rec["event"] == "journal_gap")
    return [
        (d["first_seq"], d["last_seq"])
        for d in gaps
        if isinstance(d.get("first_seq"), int) and isinstance(d.get("last_seq"), int)
    ]


def validate_journal(path: Path, jobs: int | None = None) -> ValidationReport:
    """Scan the whole journal (bounded memory per process). Problems: invalid lines, schema
    violations, seq not strictly increasing, seq gaps no ``journal_gap`` record explains. A
    torn final line is a warning (a writer may still be appending).

    A large journal is scanned in parts by ``jobs`` processes (see :mod:`journal.read.parallel`);
    the report does not depend on how it was cut.
    """
    _schema()  # built before any fork: the workers inherit it
    parts = map_ranges(_scan, path, jobs)
    # Each part checked seq order from its own first record; that joins exactly only where
    # each part begins above everything before it. If not (a corrupt journal), scan again
    # in one go.
    top = None
    for part in parts:
        if part.first_seq is not None:
            if top is not None and part.first_seq <= top:
                return _merge([_scan(path, 0, None)])
            top = part.top_seq
    return _merge(parts)


def _merge(parts: list[_Part]) -> ValidationReport:
    """One report from the parts, in file order: invalid lines, schema violations, seq order,
    unexplained gaps."""
    report = ValidationReport()
    v = parts[0].first_version
    if isinstance(v, int) and v > SCHEMA_VERSION:
        report.warnings.append(f"format version {v} is newer than {SCHEMA_VERSION}")

    def note(messages: list[str], count: int) -> None:
        report.problems += messages[: KEEP_PROBLEMS - len(report.problems)]
        report.problem_count += count

    lines_before = 0
    top: int | None = None
    gaps: list[tuple[int, int]] = []
    explained: list[tuple[int, int]] = []
    for part in parts:
        lines = [f"line {lines_before + n}: {why}" for n, why in part.invalid.items]
        note(lines, part.invalid.count)
        report.invalid_lines += part.invalid.count
        report.records += part.records
        if part.first_seq is not None:
            if top is not None and part.first_seq > top + 1:
                gaps.append((top + 1, part.first_seq - 1))
            top = part.top_seq
        gaps += part.gaps
        explained += part.explained
        if part.torn_tail:
            line = lines_before + part.lines + 1
            if part.tail_bytes > MAX_LINE_BYTES:  # no record is that long: not one being written
                note([f"line {line}: torn final line, {too_long_reason(part.tail_bytes)}"], 1)
            else:
                report.warnings.append(f"line {line}: torn final line (writer still appending?)")
        lines_before += part.lines
    for kept in [p.schema for p in parts] + [p.order for p in parts]:
        note(kept.items, kept.count)
    ranges = _merged(explained)
    unexplained = [g for g in gaps if not _covered(g, ranges)]
    note(
        [f"seq {a}..{b} missing with no journal_gap record" for a, b in unexplained],
        len(unexplained),
    )
    return report


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted, disjoint, non-adjacent ranges covering the same seqs."""
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _covered(gap: tuple[int, int], ranges: list[tuple[int, int]]) -> bool:
    """Whether one of the merged ``ranges`` holds all of ``gap``."""
    i = bisect.bisect_right(ranges, (gap[0], float("inf"))) - 1
    return i >= 0 and ranges[i][0] <= gap[0] and gap[1] <= ranges[i][1]
