"""Console output of deliveries: one line each, failures in red with the log path.

Everything in a line that comes from a record or a callback (paths, hook labels, errors,
output) is printed as plain text, never as rich markup, with control characters escaped:
``[/wiki]`` in a checkpoint path is shown as written, and a callback's NUL bytes or
terminal escapes never reach the terminal.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
from typing import TYPE_CHECKING

from journal.record.text import printable
from watcher.hooks.delivery import DeliveryResult
from watcher.hooks.hook import HIGH_RATE_EVENTS

if TYPE_CHECKING:
    from rich.console import Console


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


class ConsoleReporter:
    """Prints each finished delivery to stderr (rich), as ``ilab-watch`` shows them."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False) -> None:
        self.quiet, self.verbose = quiet, verbose
        self._lock = threading.Lock()

    @functools.cached_property
    def console(self) -> Console:
        """rich's console, made at the first line shown (18 ms of imports: a replay that
        shows nothing never pays them)."""
        from rich.console import Console

        return Console(stderr=True, highlight=False, soft_wrap=True)

    def __call__(self, out: DeliveryResult) -> None:
        """quiet: failures only; default: also successes of commands on low-rate events
        (save, evaluate, ...) with their last output line, and of callables that acted
        (returned a Control or Report); verbose: everything, with output tails. A failure's
        line ends with the last line its command wrote to stderr."""
        from rich.text import Text

        if self.quiet and not out.failed:
            return
        if (
            not self.verbose
            and not out.failed
            and out.event in HIGH_RATE_EVENTS
            and not out.control
            and out.status != "skipped"
        ):
            return
        quiet_callable = out.kind == "callable" and not (out.control or out.reports)
        if not self.verbose and out.status == "ok" and quiet_callable:
            return
        dur = f"{out.duration:.2f}s" if out.duration is not None else "-"
        tries = f", {out.attempts} attempts" if out.attempts > 1 else ""
        head = printable(f"{out.event} step {out.step} seq {out.seq}: {out.hook}")
        if out.jobs:  # --via: the last attempt's job and where it ran
            job = out.jobs[-1]
            where = f" on {job['node']}" if job.get("node") else ""
            head += printable(f" [{job['scheduler']} job {job['id']}{where}]")
        error = printable(str(out.error))
        lines: list[Text] = []
        if out.status == "skipped":
            lines.append(Text(f"- {head} skipped ({error})", style="yellow"))
        elif out.failed:
            # a callable's traceback is logged once already (watcher.engine.execute): not again
            command = out.kind == "command"
            why = last_line(out.stderr_tail) if command else None
            msg = f"✗ {head} {out.status} ({error}{tries}, {dur})"
            msg += f": {why}" if why else ""
            msg += f" log: {printable(out.log_path)}" if out.log_path else ""
            lines.append(Text(msg, style="red"))
            if command and out.stderr_tail and not out.log_path:
                tail = printable(out.stderr_tail.rstrip()[-800:], newlines=True)
                lines.append(Text(tail, style="red"))
        else:
            ctl = f" -> control {', '.join(out.control)}" if out.control else ""
            ctl += f" -> {len(out.reports)} report(s)" if out.reports else ""
            lines.append(
                Text.assemble(("✓", "green"), printable(f" {head} ok ({dur}{tries}){ctl}"))
            )
        if out.status != "skipped" and out.stdout_tail and out.stdout_tail.strip():
            text = (
                printable(out.stdout_tail.rstrip(), newlines=True)
                if self.verbose
                else last_line(out.stdout_tail, keep_end=True)
            )
            lines.append(Text(f"  {text}"))
        with self._lock:
            for line in lines:
                self.console.print(line)
        sys.stderr.flush()


class PrintableFormatter(logging.Formatter):
    """A log formatter whose lines carry no control characters (messages quote paths,
    reasons and metric names from records; a traceback keeps its lines): the watcher's
    log lines through the one :func:`~journal.record.text.printable`."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record), newlines=True)
