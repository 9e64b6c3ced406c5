"""Old import paths of watcher modules that moved into its folders: ``from
watcher.callbacks import X`` still works (journal/moved.py says how)."""

#: old module -> where it lives now. ``watcher.hooks`` and ``watcher.engine`` are folders
#: now: their modules are ``watcher.hooks.hook`` and ``watcher.engine.engine``.
MOVED: dict[str, str] = {
    "watcher.builtins": "watcher.builtin.steering",
    "watcher.callbacks": "watcher.hooks.callbacks",
    "watcher.cli_options": "watcher.cli.options",
    "watcher.command": "watcher.hooks.command",
    "watcher.completion": "watcher.engine.completion",
    "watcher.cursor": "watcher.engine.cursor",
    "watcher.delivery": "watcher.hooks.delivery",
    "watcher.execute": "watcher.engine.execute",
    "watcher.export": "watcher.exporters.base",
    "watcher.follow": "watcher.engine.follow",
    "watcher.foreign": "watcher.builtin.foreign",
    "watcher.handback": "watcher.engine.handback",
    "watcher.jobs": "watcher.scheduler.runner",
    "watcher.leasing": "watcher.engine.leasing",
    "watcher.mlflow_export": "watcher.exporters.mlflow_export",
    "watcher.notices": "watcher.engine.notices",
    "watcher.queues": "watcher.engine.queues",
    "watcher.report": "watcher.engine.console",
    "watcher.tensorboard": "watcher.exporters.tensorboard_export",
    "watcher.text": "journal.record.text",  # printable, PrintableFormatter: one for all consoles
    "watcher.trackers": "watcher.exporters.registry",
    "watcher.wake": "watcher.engine.wake",
    "watcher.wandb_export": "watcher.exporters.wandb_export",
    "watcher.wandb_log": "watcher.exporters.wandb_log",
}
