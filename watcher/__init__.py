"""The watcher: deliver journal events to callbacks outside the training processes."""

from journal.control import Control
from journal.reports import Report
from watcher.builtins import DivergenceDetector, EarlyStopping
from watcher.callbacks import Event, TrainerCallback
from watcher.delivery import DeliveryResult
from watcher.engine import Watcher
from watcher.hooks import Hook, HookOptions

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
