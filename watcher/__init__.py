"""The watcher: deliver journal events to callbacks outside the training processes."""

from journal.channels.control import Control
from journal.channels.reports import Report
from journal.moved import install as name_moved_modules
from watcher.builtin.steering import DivergenceDetector, EarlyStopping
from watcher.engine.engine import Watcher
from watcher.hooks.callbacks import Event, TrainerCallback
from watcher.hooks.delivery import DeliveryResult
from watcher.hooks.hook import Hook, HookOptions
from watcher.moved import MOVED

name_moved_modules(MOVED)

__all__ = [
    "Control",
    "DeliveryResult",
    "DivergenceDetector",
    "EarlyStopping",
    "Event",
    "Hook",
    "HookOptions",
    "Report",
    "TrainerCallback",
    "Watcher",
]
