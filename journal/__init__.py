"""The journal: the contract between trainer, watcher and people (docs/journal-format.md).

Pure Python (never imports torch): writer, crash-tolerant reader, schema, control commands,
reports and checkpoint leases.
"""

from journal.channels.control import Control, InvalidCommand, send_command
from journal.channels.reports import InvalidReport, Report, submit_report
from journal.moved import install as name_moved_modules
from journal.read.reader import InvalidLine, JournalReader, ReadBatch, iter_records, read_all
from journal.record.events import CONTROL_COMMANDS, EVENTS, LIFECYCLE_EVENTS, SCHEMA_VERSION
from journal.rundir.paths import JournalNotFound, control_dir, journal_path, resolve_journal
from journal.write.writer import JournalWriteError, JournalWriter

name_moved_modules({})

__all__ = [
    "CONTROL_COMMANDS",
    "EVENTS",
    "LIFECYCLE_EVENTS",
    "SCHEMA_VERSION",
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
