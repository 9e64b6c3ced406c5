"""The watcher: deliver journal events to callbacks outside the training processes."""

from journal.channels.control import Control
from journal.channels.reports import Report
from watcher.builtin.steering import DivergenceDetector, EarlyStopping
from watcher.engine.engine import Watcher
from watcher.hooks.callbacks import Event, TrainerCallback
from watcher.hooks.delivery import DeliveryResult
from watcher.hooks.hook import Hook, HookOptions

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
