"""``ilab-journal validate``: every record against the schema, seq order and line integrity."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.events import SCHEMA_VERSION
from journal.reader import CHUNK_SIZE, JournalReader, no_cyclic_gc


@dataclass
class ValidationReport:
    """What a full scan found. ``ok`` when there is no problem (warnings do not count)."""

    records: int = 0
    invalid_lines: int = 0
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class BatchValidator:
    """Schema checks of many records per call, about 3x the rate of validating them as models.

    Records are grouped by event and each group is checked as one list by pydantic-core, in
    strict mode and against typed-dict schemas derived from the models (no model instances,
    unknown fields ignored rather than copied). Strict accepts a subset of what the models
    accept, so a group that passes is valid; a group with any problem is checked again record
    by record with :func:`journal.schema.parse_record`, which has the final word and the
    exact messages (only the records strict mode found fault with: the others are valid).
    """

    def __init__(self) -> None:
        from pydantic_core import SchemaValidator, core_schema

        from journal.schema import PAYLOAD_MODELS, Record

        envelope = _as_typed_dict(Record.__pydantic_core_schema__)["fields"]

        def records_of(data: Any) -> SchemaValidator:
            # "data" required here: an absent one is checked by parse_record (it defaults
            # to {}, which the event's payload model may reject)
            fields = {**envelope, "data": core_schema.typed_dict_field(data, required=True)}
            record = core_schema.typed_dict_schema(fields, extra_behavior="ignore")
            return SchemaValidator(core_schema.list_schema(record))

        self._lists = {
            event: records_of(_as_typed_dict(model.__pydantic_core_schema__))
            for event, model in PAYLOAD_MODELS.items()
        }
        self._other = records_of(core_schema.dict_schema())

    def problems(self, records: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
        """(record, first problem) for each record that breaks the schema, in input order."""
        from pydantic import ValidationError

        from journal.schema import parse_record

        groups: dict[Any, list[int]] = {}
        for i, rec in enumerate(records):
            groups.setdefault(rec.get("event"), []).append(i)
        bad: list[tuple[int, str]] = []
        for event, idx in groups.items():
            try:
                self._lists.get(event, self._other).validate_python(
                    [records[i] for i in idx], strict=True
                )
                continue
            except ValidationError as exc:
                at = {e["loc"][0] for e in exc.errors() if e["loc"]}  # positions in the list
                suspects = sorted(idx[k] for k in at if isinstance(k, int))
            for i in suspects:
                try:
                    parse_record(records[i])
                except ValidationError as exc:
                    first = exc.errors()[0]
                    loc = ".".join(str(x) for x in first["loc"])
                    bad.append((i, f"{loc}: {first['msg']}"))
        bad.sort()
        return [(records[i], why) for i, why in bad]


def _check_seqs(
    records: list[dict[str, Any]],
    prev_seq: int | None,
    problems: list[str],
    gaps: list[tuple[int, int]],
) -> int | None:
    """Check that seqs go up by one from ``prev_seq`` (the highest so far); note problems
    and gaps. Returns the new highest seq. A batch without either is checked in C."""
    seqs = [r["seq"] for r in records]
    if not seqs:
        return prev_seq
    run = seqs if prev_seq is None else [prev_seq, *seqs]
    if run[-1] - run[0] == len(run) - 1 and all(map(operator.lt, run, run[1:])):
        return run[-1]
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


def validate_journal(path: Path) -> ValidationReport:
    """Scan the whole journal (bounded memory). Problems: invalid lines, schema violations,
    seq not strictly increasing, seq gaps no ``journal_gap`` record explains. A torn final
    line is a warning (a writer may still be appending)."""
    report = ValidationReport()
    schema = BatchValidator()
    prev_seq: int | None = None
    explained: set[int] = set()
    gaps: list[tuple[int, int]] = []
    reader = JournalReader(path)
    with no_cyclic_gc():
        while True:
            before = reader.offset
            batch = reader.read(final=False, max_bytes=CHUNK_SIZE)
            if reader.offset == before:
                if batch.torn_tail:
                    report.warnings.append(
                        f"line {batch.line_no + 1}: torn final line (writer still appending?)"
                    )
                break
            for line in batch.invalid:
                report.problems.append(f"line {line.line_no}: {line.reason}")
            report.invalid_lines += len(batch.invalid)
            for rec, why in schema.problems(batch.records):
                report.problems.append(f"seq {rec.get('seq')}: {rec.get('event')}: {why}")
            if batch.records and report.records == 0:
                v = batch.records[0].get("v")
                if isinstance(v, int) and v > SCHEMA_VERSION:
                    report.warnings.append(f"format version {v} is newer than {SCHEMA_VERSION}")
            report.records += len(batch.records)
            prev_seq = _check_seqs(batch.records, prev_seq, report.problems, gaps)
            for rec in batch.records:
                if rec["event"] == "journal_gap":
                    d = rec.get("data") or {}
                    if isinstance(d.get("first_seq"), int) and isinstance(d.get("last_seq"), int):
                        explained.update(range(d["first_seq"], d["last_seq"] + 1))
    for a, b in gaps:
        if not all(s in explained for s in range(a, b + 1)):
            report.problems.append(f"seq {a}..{b} missing with no journal_gap record")
    return report
