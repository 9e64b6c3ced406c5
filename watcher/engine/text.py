"""Text from records and callback output, made safe to print on a terminal."""

from __future__ import annotations

import logging
import re

# C0 controls but tab and newline, DEL and C1 controls: terminal escapes (ESC), bells,
# carriage returns that overwrite a line, NUL bytes.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_CONTROL_AND_NEWLINE = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable(text: str, *, newlines: bool = False) -> str:
    """``text`` with control characters shown as ``\\xNN`` (tabs kept; newlines kept only
    with ``newlines=True``), so that no byte of it acts on the terminal."""
    pattern = _CONTROL if newlines else _CONTROL_AND_NEWLINE
    return pattern.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def last_line(text: str | None, limit: int = 300, *, keep_end: bool = False) -> str | None:
    """The last non-blank line of ``text``, printable and at most ``limit`` characters
    (its start, or with ``keep_end`` its end, where a progress line has its news)."""
    for line in reversed((text or "").splitlines()):
        if line.strip():
            line = printable(line.strip())
            if len(line) <= limit:
                return line
            return "..." + line[3 - limit :] if keep_end else line[: limit - 3] + "..."
    return None


class PrintableFormatter(logging.Formatter):
    """A log formatter whose lines carry no control characters (messages quote paths,
    reasons and metric names from records)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), newlines=True)
