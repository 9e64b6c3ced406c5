"""The journal: the contract between trainer, watcher and people (docs/journal-format.md).

Pure Python (never imports torch): writer, crash-tolerant reader, schema and control writer.
"""

from journal.control import Control, InvalidCommand, send_command
from journal.events import CONTROL_COMMANDS, EVENTS, LIFECYCLE_EVENTS, SCHEMA_VERSION
from journal.paths import JournalNotFound, control_dir, journal_path, resolve_journal
from journal.reader import InvalidLine, JournalReader, ReadBatch, iter_records, read_all
from journal.writer import JournalWriteError, JournalWriter

__all__ = [
    "CONTROL_COMMANDS",
    "EVENTS",
    "LIFECYCLE_EVENTS",
    "SCHEMA_VERSION",
    "Control",
    "InvalidCommand",
    "InvalidLine",
    "JournalNotFound",
    "JournalReader",
    "JournalWriteError",
    "JournalWriter",
    "ReadBatch",
    "control_dir",
    "iter_records",
    "journal_path",
    "read_all",
    "resolve_journal",
    "send_command",
]
