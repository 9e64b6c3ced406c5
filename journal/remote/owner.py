"""A store prefix belongs to one run from its first write, as a journal does.

The mirror's first write under its URI is ``owner.json``: the run's id and a hash of its
journal's first line (which no other run's journal shares). A mirror refused there (another
run owns the prefix) writes and deletes nothing under it; and every write and delete of a
mirror that owns it checks, first, that ``owner.json`` still names its run (a second run
mirrored to the same URI meanwhile, the prefix emptied by hand): :class:`OwnedStore`. A
prefix mirrored before ``owner.json`` existed is claimed once its first segment is found to
begin as the local journal does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson

from journal.remote.errors import classify
from journal.remote.layout import JOURNAL_PREFIX, OWNER_KEY, segments
from journal.remote.store import Store, TooLarge
from journal.rundir.inbox import MAX_FILE_BYTES

#: How much of the journal's first line identifies it (a longer line: its first bytes).
HEAD_BYTES = 64 * 1024


class NotOwner(Exception):
    """The prefix is another run's mirror (one line for the user): nothing is written."""


class PrefixGone(NotOwner):
    """The prefix this mirror owned lost its ``owner.json`` (emptied by hand, its bucket
    deleted): nothing more is written there; no retry brings it back."""


def journal_head(data: bytes) -> bytes | None:
    """A journal's first line (through its newline, HEAD_BYTES at most); None while the
    first line is not complete."""
    end = data.find(b"\n", 0, HEAD_BYTES)
    if end >= 0:
        return data[: end + 1]
    return data[:HEAD_BYTES] if len(data) >= HEAD_BYTES else None


def _identity(head: bytes) -> dict[str, Any]:
    try:
        rec = orjson.loads(head)
    except orjson.JSONDecodeError:
        rec = None
    run_id = rec.get("run_id") if isinstance(rec, dict) else None
    return {
        "run_id": run_id if isinstance(run_id, str) else None,
        "journal_head_sha256": hashlib.sha256(head).hexdigest(),
    }


class OwnedStore(Store):
    """The mirror's store for the run whose journal is ``journal``: no write or delete
    before :meth:`claim` has found the prefix to be this run's, and each one checks that it
    still is (raising :class:`NotOwner` otherwise)."""

    def __init__(self, uri: str, journal: Path, **kwargs: Any) -> None:
        super().__init__(uri, **kwargs)
        self.journal = Path(journal)
        self._mine: dict[str, Any] | None = None

    @property
    def claimed(self) -> bool:
        return self._mine is not None

    def claim(self) -> bool:
        """Make the prefix this run's, or find that it is; False while the local journal
        has no complete first line (nothing to tell the run by yet). Raises
        :class:`NotOwner` and the store's errors."""
        try:
            with open(self.journal, "rb") as f:
                head = journal_head(f.read(HEAD_BYTES))
        except FileNotFoundError:
            head = None
        if head is None:
            return False
        mine = {**_identity(head), "journal": str(self.journal)}
        there = self._owner()
        if there is None:
            self._check_segments(head)
            there = self._create(mine)
        if there.get("journal_head_sha256") != mine["journal_head_sha256"]:
            raise NotOwner(self._refusal(there))
        self._mine = mine
        return True

    def _owner(self) -> dict[str, Any] | None:
        """``owner.json``, or None where there is none (an unreadable one names no run)."""
        try:
            data = self.get_bytes(OWNER_KEY, MAX_FILE_BYTES)
        except FileNotFoundError as exc:
            if classify(exc).permanent:  # the bucket, not the key, is missing
                raise
            return None
        except TooLarge:
            return {}
        try:
            obj = json.loads(data)
        except ValueError:
            return {}
        return obj if isinstance(obj, dict) else {}

    def _check_segments(self, head: bytes) -> None:
        """A prefix mirrored before owner.json: its journal must begin as ours does."""
        found = segments(self.listing(JOURNAL_PREFIX))
        if found and journal_head(self.head(found[0].key, HEAD_BYTES)) != head:
            raise NotOwner(
                f"{self.url(JOURNAL_PREFIX)} holds another journal than {self.journal}; give "
                "the mirror a new URI"
            )

    def _create(self, mine: dict[str, Any]) -> dict[str, Any]:
        """Write owner.json unless one is there by now (an exclusive create where the store
        has one); what it holds afterwards decides."""
        data = json.dumps(mine, sort_keys=True).encode()
        path = self.path(OWNER_KEY)
        try:
            try:
                self.fs.pipe_file(path, data, mode="create")
            except TypeError:  # a filesystem without exclusive create
                self.fs.pipe_file(path, data)
        except Exception:  # another's create won (FileExistsError, PreconditionFailed)
            there = self._owner()
            if there is None:
                raise  # not written: denied, no such bucket, ...
            return there
        there = self._owner()
        if there is None:
            raise NotOwner(f"{self.url(OWNER_KEY)} was not there right after it was written")
        return there

    def _refusal(self, there: dict[str, Any]) -> str:
        run = there.get("run_id")
        whose = f"run {run}'s" if isinstance(run, str) else "another run's"
        return (
            f"{self.uri} holds {whose} mirror ({OWNER_KEY}), not {self.journal}'s: a mirror "
            "touches no other run's prefix; give the mirror a new URI"
        )

    def _verify(self) -> None:
        """Before each write or delete: the prefix is still this run's."""
        if self._mine is None:
            raise NotOwner(f"{self.uri}: not claimed for {self.journal} yet (nothing written)")
        there = self._owner()
        if there is None:
            raise PrefixGone(
                f"{self.url(OWNER_KEY)} is gone (the prefix emptied, the bucket deleted?): "
                "nothing more is written there"
            )
        if there.get("journal_head_sha256") != self._mine["journal_head_sha256"]:
            raise NotOwner(self._refusal(there))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._verify()
        super().put_bytes(key, data)

    def put_files(self, pairs: list[tuple[str, str]]) -> None:
        if pairs:
            self._verify()
        super().put_files(pairs)

    def move(self, key: str, to: str) -> None:
        self._verify()
        super().move(key, to)

    def delete(self, keys: list[str]) -> None:
        if keys:
            self._verify()
        super().delete(keys)
