"""What a watcher had to say: problems that do not stop delivery, each said once."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("watcher")


class Notices:
    """Call with a message: logged as a warning the first time, kept in :attr:`said`.

    The engine makes one and hands it to every part, so that a full disk or an invalid line
    is one line however many deliveries meet it."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self._lock = threading.Lock()

    def __call__(self, msg: str) -> None:
        with self._lock:
            if msg in self.said:
                return
            self.said.append(msg)
        log.warning(msg)
