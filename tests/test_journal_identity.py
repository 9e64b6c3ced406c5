"""A journal's identity (the hash of its first line) has one home,
journal/read/lines.py: ``first_line_fingerprint``. The index (journal/views/index.py) and the
watcher's follower (watcher/engine/follow.py) both use it, so a symlinked journal is treated
the same by both: never followed, no identity, no trusted index, no cursor check."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from journal.read import lines
from journal.read.lines import first_line_fingerprint
from journal.rundir.paths import INDEX_NAME, JOURNAL_NAME
from journal.views import index
from tests.helpers import cli, write_run
from watcher.engine import follow
from watcher.engine.follow import JournalFollower


def test_the_fingerprint_is_the_first_lines_hash(ckpt: Path) -> None:
    write_run(ckpt, steps=2)
    path = ckpt / JOURNAL_NAME
    first = path.read_bytes().split(b"\n")[0] + b"\n"
    fp = first_line_fingerprint(path)
    assert fp == hashlib.sha1(first).hexdigest()[:16]
    write_run(ckpt, steps=2, resume=True)  # grown, not replaced: the same journal
    assert first_line_fingerprint(path) == fp


def test_no_fingerprint_without_a_regular_file_with_a_first_line(tmp_path: Path) -> None:
    torn = tmp_path / "torn.jsonl"
    torn.write_bytes(b'{"seq": 0, "event": "train_be')  # no newline yet
    long = tmp_path / "long.jsonl"
    long.write_bytes(b"x" * lines.FINGERPRINT_BYTES + b"\n")
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # never blocks: a FIFO is no journal
    for path in (torn, long, fifo, tmp_path, tmp_path / "missing.jsonl"):
        assert first_line_fingerprint(path) is None, path


def test_a_symlinked_journal_has_no_identity_for_the_index_or_the_watcher(tmp_path: Path) -> None:
    real = tmp_path / "real"
    write_run(real, steps=3)
    journal = real / JOURNAL_NAME
    fp = first_line_fingerprint(journal)
    assert fp is not None and index.load(journal) is not None  # the writer's index
    linked = tmp_path / "linked"
    linked.mkdir(mode=0o700)
    (linked / JOURNAL_NAME).symlink_to(journal)
    shutil.copy(real / INDEX_NAME, linked / INDEX_NAME)  # its fingerprint: the target's

    link = linked / JOURNAL_NAME
    assert first_line_fingerprint(link) is None  # not followed
    assert index.load(link) is None  # so its index is not trusted ...
    full = index.summarize(journal, use_index=False).fold.summary(now=1e12)
    assert index.summarize(link).fold.summary(now=1e12) == full  # ... a full scan
    assert JournalFollower(link, poll=0.1).fingerprint() is None  # the watcher: the same
    assert JournalFollower(journal, poll=0.1).fingerprint() == fp

    # one function behind both, not two that agree today
    assert follow.first_line_fingerprint is index.first_line_fingerprint is first_line_fingerprint

    # and ilab-watch refuses the symlinked journal outright (exit 2)
    proc = cli("ilab-watch", str(linked), "--replay", "--on-log", "true")
    assert proc.returncode == 2 and "symbolic link" in proc.stderr, proc.stderr
