"""Importing a user's callback from its spec: ``module:attr`` or ``path/to/file.py:attr``
(``ilab-watch --callback``, ``backtest``)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from watcher.hooks.callbacks import CallbackSpecError


def load_object(spec: str) -> Any:
    """Import ``module:attr`` (or ``path/to/file.py:attr``); a module that cannot be
    imported (whatever it raises, ``SystemExit`` too; not Ctrl-C) is a
    :class:`CallbackSpecError` of one line."""
    import importlib
    import importlib.util

    if ":" not in spec:
        raise CallbackSpecError(f"{spec!r}: expected module:object")
    mod_name, _, attr = spec.rpartition(":")
    try:
        if mod_name.endswith(".py"):
            path = Path(mod_name)
            if not path.is_file():
                raise CallbackSpecError(f"{spec!r}: file {mod_name} not found")
            s = importlib.util.spec_from_file_location(path.stem, path)
            assert s is not None and s.loader is not None
            module = importlib.util.module_from_spec(s)
            sys.modules[path.stem] = module
            s.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(mod_name)
    except (CallbackSpecError, KeyboardInterrupt):
        raise
    except BaseException as exc:  # sys.exit() at import too: a failed import, not the end
        raise CallbackSpecError(
            f"{spec!r}: cannot import {mod_name}: {type(exc).__name__}: {exc}"
        ) from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CallbackSpecError(f"{spec!r}: {mod_name} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return obj
