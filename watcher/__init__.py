"""The watcher: deliver journal events to callbacks outside the training processes."""

from journal.control import Control
from watcher.builtins import DivergenceDetector, EarlyStopping
from watcher.callbacks import Event, TrainerCallback
from watcher.engine import Hook, HookOptions, Outcome, Watcher

__all__ = [
    "Control",
    "DivergenceDetector",
    "EarlyStopping",
    "Event",
    "Hook",
    "HookOptions",
    "Outcome",
    "TrainerCallback",
    "Watcher",
]
