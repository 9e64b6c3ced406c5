"""Text from records made safe to print on a terminal: the one ``printable`` of every console
(``ilab-journal``, ``ilab-watch``, ``ilab-train``).

A record's strings (reasons, metric names, callback names, paths) and a callback's output are
data, never instructions to the terminal: an escape sequence could recolour, retitle or
clear the screen, a carriage return overwrite a line, and a bidi override reorder what is
shown (``U+202E`` makes ``evil.exe`` read as ``exe.live``). Each such character is shown as
an escape instead: ``\\x1b`` for C0/C1 controls and DEL, ``\\u202e`` for the invisible marks.
"""

from __future__ import annotations

#: C0 and C1 control characters and DEL: terminal escapes (ESC, CSI), bells, carriage
#: returns that overwrite a line, NUL bytes.
_C0_C1 = (*range(0x20), 0x7F, *range(0x80, 0xA0))
#: Invisible marks that reorder or break text: the Arabic letter mark, LRM/RLM, the line and
#: paragraph separators, the bidi embeddings/overrides (U+202A-202E) and isolates
#: (U+2066-2069).
_MARKS = (0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A))

#: One line: every control character escaped, newline and tab too.
_ONE_LINE: dict[int, str] = {c: f"\\x{c:02x}" for c in _C0_C1} | {c: f"\\u{c:04x}" for c in _MARKS}
#: Multi-line text (a command's output tail, a log message with a traceback): its newlines
#: and tabs are layout, the rest is escaped as on one line.
_MULTI_LINE: dict[int, str] = {c: e for c, e in _ONE_LINE.items() if c not in (0x09, 0x0A)}


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` safe to print on a terminal: control characters and bidi marks are shown as
    escapes (``\\x1b``, ``\\u202e``), not obeyed. ``newlines=True`` keeps newlines and
    tabs, for a caller that prints a block of lines on purpose."""
    return text.translate(_MULTI_LINE if newlines else _ONE_LINE)
