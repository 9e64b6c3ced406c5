"""Import paths of modules that moved into the packages' folders still work: ``import
journal.query`` (or ``from watcher.callbacks import X``) loads the module where it lives
now and names it by the old path too, without a file per old name. The tables are the
whole list; tests/test_public_api.py pins the documented ones."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType

#: old module -> where it lives now (journal/ since its folders); watcher/moved.py adds its own
MOVED: dict[str, str] = {
    "journal.best": "journal.views.best",
    "journal.cli_common": "journal.cli.common",
    "journal.cli_export": "journal.cli.export",
    "journal.cli_read": "journal.cli.read",
    "journal.cli_write": "journal.cli.write",
    "journal.control": "journal.channels.control",
    "journal.events": "journal.record.events",
    "journal.fields": "journal.record.fields",
    "journal.files": "journal.rundir.files",
    "journal.format": "journal.cli.format",
    "journal.inbox": "journal.rundir.inbox",
    "journal.index": "journal.views.index",
    "journal.jobs": "journal.channels.jobs",
    "journal.leases": "journal.checkpoints.leases",
    "journal.lines": "journal.read.lines",
    "journal.live": "journal.cli.tail",
    "journal.lock": "journal.rundir.lock",
    "journal.parallel": "journal.read.parallel",
    "journal.paths": "journal.rundir.paths",
    "journal.plot": "journal.cli.plot",
    "journal.procs": "journal.rundir.procs",
    "journal.query": "journal.views.query",
    "journal.reader": "journal.read.reader",
    "journal.recreate": "journal.write.recreate",
    "journal.reports": "journal.channels.reports",
    "journal.rotation": "journal.checkpoints.rotation",
    "journal.rundir": "journal.rundir.safety",
    "journal.schema": "journal.record.schema",
    "journal.summary": "journal.views.summary",
    "journal.tailing": "journal.read.tailing",
    "journal.validate": "journal.views.validate",
    "journal.writer": "journal.write.writer",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """A finder for the old names: the module object is the new one, loaded once."""

    def __init__(self) -> None:
        #: a module's own spec between create_module and exec_module, by its (new) name:
        #: two old names imported at once from two threads must not swap specs
        self._specs: dict[str, importlib.machinery.ModuleSpec | None] = {}

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(MOVED[spec.name])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # the import system set the old name's spec on the module: give it its own back
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)


def install(moved: dict[str, str]) -> None:
    """Name ``moved``'s modules by their old paths too: the finder goes on ``sys.meta_path``
    once (after the path finder, so only names no file answers reach it)."""
    MOVED.update(moved)
    if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
        sys.meta_path.append(_MovedModules())


def old_module_name(module: str) -> str:
    """The path a moved module had (``watcher.builtin.steering`` -> ``watcher.builtins``),
    else ``module``: names that outlive a run (a watcher's default cursor name, a callback's
    label in results) stay what they were before the folders."""
    for old, new in MOVED.items():
        if new == module:
            return old
    return module
