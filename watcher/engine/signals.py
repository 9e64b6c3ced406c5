"""SIGINT and SIGTERM as a request to stop, safe under a burst of signals.

A Python signal handler runs in the main thread between two bytecodes, possibly while that
thread holds a lock (inside ``threading.Event.set`` or ``wait``), and a second signal may
run the handler again inside the first. A handler that takes a lock itself (``Event.set``)
then waits for a lock its own thread holds: ``ilab-watch`` hung on a burst of ``kill
-TERM``. So the handler here only records the signal; ``signal.set_wakeup_fd`` makes the
interpreter's C-level handler write its number to a pipe, and a thread reading that pipe
calls the stop callbacks: ordinary code in an ordinary thread, which may take any lock.
Every signal asks for the same graceful stop; the callbacks must not mind being called
again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType

#: The signals that ask for a stop.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopOnSignal:
    """``with StopOnSignal(watcher.request_stop, ...) as signals:`` each callback is called
    (from a helper thread) when SIGINT or SIGTERM arrives; ``signals.received`` says
    whether one did. Enter it in the main thread (Python's rule for signal handlers).

    On exit the previous wakeup fd comes back, but not the previous handlers: what follows
    is the process's shutdown, which a signal has nothing more to ask of, and the default
    action (death by SIGTERM, a KeyboardInterrupt traceback) would cut it short. After a
    stop was asked for, the signals are ignored from then on: Python's finalisation puts
    the default action back for a signal that has a Python handler, not for an ignored one
    (a burst of SIGTERMs still arriving then killed the stopping watcher)."""

    def __init__(self, *on_stop: Callable[[], object]) -> None:
        self._on_stop = on_stop
        self._seen: list[int] = []  # appended by the handler: one C call, reentrancy-safe
        self._asked = False  # set by the thread once it called the callbacks
        self._read_fd = self._write_fd = -1
        self._thread: threading.Thread | None = None
        self._old_fd = -1

    @property
    def received(self) -> bool:
        """Whether SIGINT or SIGTERM arrived since entering."""
        return bool(self._seen) or self._asked

    def _record(self, signum: int, _frame: FrameType | None) -> None:
        # Nothing here may take a lock: see the module docstring.
        self._seen.append(signum)

    def _relay(self) -> None:
        """Read signal numbers from the wakeup pipe until it is closed; call the callbacks
        for each stop signal."""
        while True:
            try:
                data = os.read(self._read_fd, 512)
            except InterruptedError:  # pragma: no cover - retried by Python itself (PEP 475)
                continue
            except OSError:
                return
            if not data:
                return  # the write end was closed: __exit__
            if any(b in STOP_SIGNALS for b in data):
                self._asked = True
                for stop in self._on_stop:
                    stop()

    def __enter__(self) -> StopOnSignal:
        self._read_fd, self._write_fd = os.pipe()
        # The C handler must never block on a full pipe; the reader blocks, as a thread may.
        os.set_blocking(self._write_fd, False)
        self._thread = threading.Thread(target=self._relay, name="ilab-signals", daemon=True)
        self._thread.start()
        self._old_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._record)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.received:
            for signum in STOP_SIGNALS:
                signal.signal(signum, signal.SIG_IGN)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._write_fd)  # the relay reads EOF and returns
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
