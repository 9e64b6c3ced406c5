"""Building hooks from what users give: command strings, callables and callback objects."""

from __future__ import annotations

from typing import Any

from watcher.callbacks import (
    CallbackSpecError,
    CommandTarget,
    callable_name,
    check_callable,
    hooked_methods,
)
from watcher.engine import Hook, HookOptions


def hook_for(event: str, spec: Any, options: HookOptions, *, shell: bool = False) -> Hook:
    """A command string or a Python callable bound to ``event``."""
    if isinstance(spec, str):
        return Hook(event, CommandTarget.parse(spec, event, shell=shell), options)
    check_callable(spec, f"on_{event}")
    return Hook(event, spec, options)


def hooks_for_object(obj: Any, options_for: Any) -> list[Hook]:
    """One hook per ``on_<event>`` method the object implements (class-based callbacks)."""
    methods = hooked_methods(obj)
    if not methods:
        raise CallbackSpecError(f"{callable_name(obj)} implements no on_<event> method")
    name = callable_name(type(obj))
    return [
        Hook(ev, meth, options_for(ev), label=f"{name}.on_{ev}") for ev, meth in methods.items()
    ]


def instantiate(obj: Any, where: str) -> Any:
    """A class given by name is constructed with no arguments."""
    if isinstance(obj, type):
        try:
            return obj()
        except TypeError as exc:
            raise CallbackSpecError(
                f"{where}: cannot construct {callable_name(obj)}() without arguments: {exc}"
            ) from None
    return obj
