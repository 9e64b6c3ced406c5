"""``ilab-journal validate``: every record against the schema, seq order and line integrity."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from journal.events import SCHEMA_VERSION
from journal.reader import CHUNK_SIZE, JournalReader


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


def validate_journal(path: Path) -> ValidationReport:
    """Scan the whole journal (bounded memory). Problems: invalid lines, schema violations,
    seq not strictly increasing, seq gaps no ``journal_gap`` record explains. A torn final
    line is a warning (a writer may still be appending)."""
    from pydantic import ValidationError

    from journal.schema import parse_record

    report = ValidationReport()
    prev_seq: int | None = None
    explained: set[int] = set()
    gaps: list[tuple[int, int]] = []
    reader = JournalReader(path)
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
        for rec in batch.records:
            report.records += 1
            try:
                parse_record(rec)
            except ValidationError as exc:
                first = exc.errors()[0]
                loc = ".".join(str(x) for x in first["loc"])
                report.problems.append(
                    f"seq {rec.get('seq')}: {rec.get('event')}: {loc}: {first['msg']}"
                )
            seq = rec["seq"]
            if prev_seq is not None:
                if seq <= prev_seq:
                    report.problems.append(f"seq {seq} after {prev_seq}: not strictly increasing")
                elif seq > prev_seq + 1:
                    gaps.append((prev_seq + 1, seq - 1))
            if rec.get("event") == "journal_gap":
                d = rec.get("data") or {}
                if isinstance(d.get("first_seq"), int) and isinstance(d.get("last_seq"), int):
                    explained.update(range(d["first_seq"], d["last_seq"] + 1))
            v = rec.get("v")
            if report.records == 1 and isinstance(v, int) and v > SCHEMA_VERSION:
                report.warnings.append(f"format version {v} is newer than {SCHEMA_VERSION}")
            prev_seq = seq if prev_seq is None else max(prev_seq, seq)
    for a, b in gaps:
        if not all(s in explained for s in range(a, b + 1)):
            report.problems.append(f"seq {a}..{b} missing with no journal_gap record")
    return report
