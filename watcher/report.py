"""Console output of deliveries: one line each, failures in red with the log path."""

from __future__ import annotations

import sys
import threading

from watcher.delivery import DeliveryResult
from watcher.hooks import HIGH_RATE_EVENTS


class ConsoleReporter:
    """Prints each finished delivery to stderr (rich), as ``ilab-watch`` shows them."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.quiet, self.verbose = quiet, verbose
        self._lock = threading.Lock()

    def __call__(self, out: DeliveryResult) -> None:
        """quiet: failures only; default: also successes of commands on low-rate events
        (save, evaluate, ...) with their last output line, and of callables that acted
        (returned a Control or Report); verbose: everything, with output tails."""
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
        head = f"{out.event} step {out.step} seq {out.seq}: {out.hook}"
        with self._lock:
            if out.status == "skipped":
                self.console.print(f"[yellow]- {head} skipped ({out.error})[/yellow]")
                return
            if out.failed:
                where = f" log: {out.log_path}" if out.log_path else ""
                self.console.print(
                    f"[red]✗ {head} {out.status} ({out.error}{tries}, {dur}){where}[/red]"
                )
                if out.stderr_tail and not out.log_path:
                    self.console.print(f"[red]{out.stderr_tail.rstrip()[-800:]}[/red]")
            else:
                ctl = f" -> control {', '.join(out.control)}" if out.control else ""
                ctl += f" -> {len(out.reports)} report(s)" if out.reports else ""
                self.console.print(f"[green]✓[/green] {head} ok ({dur}{tries}){ctl}")
            if out.stdout_tail and out.stdout_tail.strip():
                text = (
                    out.stdout_tail.rstrip()
                    if self.verbose
                    else out.stdout_tail.strip().splitlines()[-1]
                )
                self.console.print(f"  {text}", markup=False)
        sys.stderr.flush()
