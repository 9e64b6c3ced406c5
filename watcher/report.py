"""Console output of deliveries: one line each, failures in red with the log path."""

from __future__ import annotations

import sys
import threading

from watcher.engine import Outcome


class ConsoleReporter:
    def __init__(self, *, quiet: bool = False, verbose: bool = False) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet, self.verbose = quiet, verbose
        self._lock = threading.Lock()

    def __call__(self, out: Outcome) -> None:
        if self.quiet and not out.failed:
            return
        dur = f"{out.duration:.2f}s" if out.duration is not None else "-"
        tries = f", {out.attempts} attempts" if out.attempts > 1 else ""
        head = f"{out.event} step {out.step} seq {out.seq}: {out.hook}"
        with self._lock:
            if out.failed:
                where = f" log: {out.log_path}" if out.log_path else ""
                self.console.print(
                    f"[red]✗ {head} {out.status} ({out.error}{tries}, {dur}){where}[/red]"
                )
                if out.stderr_tail and not out.log_path:
                    self.console.print(f"[red]{out.stderr_tail.rstrip()[-800:]}[/red]")
            else:
                ctl = f" -> control {', '.join(out.control)}" if out.control else ""
                self.console.print(f"[green]✓[/green] {head} ok ({dur}{tries}){ctl}")
            if self.verbose and out.stdout_tail:
                self.console.print(out.stdout_tail.rstrip(), markup=False)
        sys.stderr.flush()
