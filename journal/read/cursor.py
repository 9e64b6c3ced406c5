"""Where a reader of a journal is: one typed value instead of loose ``(offset, line_no)``
pairs, for every reader that reads on from where it was (the index behind ``status``,
``tail -f``, ``serve``, ``check --wait``, the watcher's durable cursor)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cursor:
    """A position in a journal: ``offset``, the byte just past the last complete line read
    (always a line start), and ``line_no``, how many lines lie before it (for the invalid
    lines' numbers). ``Cursor()`` is the journal's start."""

    offset: int = 0
    line_no: int = 0

    def __post_init__(self) -> None:
        if self.offset < 0 or self.line_no < 0:
            raise ValueError(f"a cursor is never negative: {self}")


#: The start of a journal.
START = Cursor()
