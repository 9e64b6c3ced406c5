"""Ctrl-C and SIGTERM while the launcher waits for torchrun.

A first Ctrl-C lets the workers finish the step, save and end (they got SIGINT too). A
second one says so in one line and terminates torchrun; a third kills it. Ctrl-C is counted
by a signal handler, never raised: a KeyboardInterrupt arriving while the previous one is
handled would print a chained traceback ("During handling of the above exception").
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from typing import Any


class StoppedNow(KeyboardInterrupt):
    """Ctrl-C came twice: torchrun was ended without waiting for the workers' save (said
    in one line when it happened; ``ilab-train`` exits 130)."""


def wait_for_torchrun(proc: subprocess.Popen[bytes]) -> tuple[int, bool]:
    """Wait for torchrun; return its exit code and whether Ctrl-C came twice. SIGTERM to
    the launcher is passed on to torchrun."""
    interrupts = 0

    def forward_term(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    def on_interrupt(_signum: int, _frame: Any) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 2:
            print("ilab-train: interrupted again: stopping now", file=sys.stderr, flush=True)
        with contextlib.suppress(ProcessLookupError):
            if interrupts == 2:
                proc.terminate()
            elif interrupts > 2:
                proc.kill()

    old: list[tuple[int, Any]] = []
    if threading.current_thread() is threading.main_thread():
        old = [(signal.SIGTERM, signal.signal(signal.SIGTERM, forward_term))]
        old.append((signal.SIGINT, signal.signal(signal.SIGINT, on_interrupt)))
    try:
        while True:
            try:
                return proc.wait(), interrupts >= 2
            except KeyboardInterrupt:  # not the main thread: our handler is not installed
                on_interrupt(signal.SIGINT, None)
    finally:
        for signum, handler in old:
            signal.signal(signum, handler)
