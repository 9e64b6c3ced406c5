"""The journal: the contract between trainer, watcher and people (docs/journal-format.md).

Pure Python (never imports torch): writer, crash-tolerant reader, schema, control commands,
reports and checkpoint leases.

The public names below load on first use (PEP 562), so a command that needs none of them,
such as ``ilab-journal status``, does not pay for importing the writer or the channels.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "CommandRefused": "journal.channels.control",
    "Control": "journal.channels.control",
    "InvalidCommand": "journal.channels.control",
    "send_command": "journal.channels.control",
    "InvalidReport": "journal.channels.reports",
    "Report": "journal.channels.reports",
    "submit_report": "journal.channels.reports",
    "InvalidLine": "journal.read.reader",
    "JournalReader": "journal.read.reader",
    "ReadBatch": "journal.read.reader",
    "iter_records": "journal.read.reader",
    "read_all": "journal.read.reader",
    "CONTROL_COMMANDS": "journal.record.events",
    "EVENTS": "journal.record.events",
    "LIFECYCLE_EVENTS": "journal.record.events",
    "SCHEMA_VERSION": "journal.record.events",
    "JournalNotFound": "journal.rundir.paths",
    "control_dir": "journal.rundir.paths",
    "journal_path": "journal.rundir.paths",
    "resolve_journal": "journal.rundir.paths",
    "JournalWriteError": "journal.write.writer",
    "JournalWriter": "journal.write.writer",
}

__all__ = [
    "CONTROL_COMMANDS",
    "EVENTS",
    "LIFECYCLE_EVENTS",
    "SCHEMA_VERSION",
    "CommandRefused",
    "Control",
    "InvalidCommand",
    "InvalidLine",
    "InvalidReport",
    "JournalNotFound",
    "JournalReader",
    "JournalWriteError",
    "JournalWriter",
    "ReadBatch",
    "Report",
    "control_dir",
    "iter_records",
    "journal_path",
    "read_all",
    "resolve_journal",
    "send_command",
    "submit_report",
]

if TYPE_CHECKING:
    from journal.channels.control import CommandRefused, Control, InvalidCommand, send_command
    from journal.channels.reports import InvalidReport, Report, submit_report
    from journal.read.reader import InvalidLine, JournalReader, ReadBatch, iter_records, read_all
    from journal.record.events import CONTROL_COMMANDS, EVENTS, LIFECYCLE_EVENTS, SCHEMA_VERSION
    from journal.rundir.paths import JournalNotFound, control_dir, journal_path, resolve_journal
    from journal.write.writer import JournalWriteError, JournalWriter


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'journal' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
