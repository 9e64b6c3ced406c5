"""Which lines of the workers' and torchrun's output reach the user's console.

Everything does, except Python tracebacks and torchrun's failure report (the ``=====``
block after ``ChildFailedError``): a worker that fails has already logged one clear line
(``[rank0] data error: ...``), and the launcher ends with ``ilab-train: training failed:
... (log: ...)``. The launch log keeps every line, tracebacks included, and ``train_end``
in the journal carries the failing rank's traceback.
"""

from __future__ import annotations

import re
import sys

_TRACEBACK = "Traceback (most recent call last):"
_CHAINED = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
#: torchrun's agent logs through glog-style lines: ``E1123 09:44:21.275000 21190 .../elastic/...``
_TORCHRUN_LOG = re.compile(r"^[EWI]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ .*distributed/elastic/")
_RULE = "=" * 60  # torchrun's ChildFailedError report opens and closes with it


class ConsoleFilter:
    """Feed it every output line in order; ``show(line)`` says whether to echo it."""

    def __init__(self) -> None:
        self._in_traceback = False
        self._after_traceback = False  # blank lines, then maybe a chained traceback
        self._report_next = False  # the last traceback was torchrun's ChildFailedError
        self._in_report = False

    def show(self, line: str) -> bool:
        bare = _strip_rank_prefix(line.rstrip("\r\n"))
        if self._in_report:  # up to and including the closing rule
            self._in_report = bare.strip() != _RULE
            return False
        if self._report_next and bare.strip() == _RULE:
            self._report_next, self._in_report = False, True
            return False
        self._report_next = False
        if _TORCHRUN_LOG.match(bare):  # the agent's own log lines (kept in the launch log)
            return False
        if bare.startswith(_TRACEBACK):
            self._in_traceback = True
            return False
        if self._in_traceback:
            if not bare.strip() or bare.startswith((" ", "\t")) or bare in _CHAINED:
                return False  # frames, source lines, carets, blank lines between chains
            self._in_traceback = False  # the exception line ends it ...
            self._after_traceback = True  # ... unless another is chained to it
            self._report_next = "ChildFailedError" in bare
            return False
        if self._after_traceback:
            if not bare.strip():
                return False
            self._after_traceback = False
            if bare.strip() in _CHAINED:  # "During handling of the above exception, ..."
                self._in_traceback = True
                return False
        return True


def say(message: str) -> None:
    """One line of the launcher's own on the console (stderr): ``ilab-train: <message>``."""
    print(f"ilab-train: {message}", file=sys.stderr)


def _strip_rank_prefix(text: str) -> str:
    """torchrun may prefix worker lines with ``[rank0]:``; the structure of a traceback is
    what follows."""
    if text.startswith("[rank") and "]:" in text[:16]:
        return text.split("]:", 1)[1]
    return text
