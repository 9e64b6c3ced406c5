"""Who stopped a run: the ``source`` of the command that ended it, told apart in one word.

``train_end`` names the ending command (``command_id``, and ``command_source`` since the
trainer journals it; for older journals the applied ``control`` record with that id gives
it). :func:`stop_kind` maps that source to one of :data:`STOP_KINDS`, which ``status``
shows and ``ilab-journal check`` compares (``stop_source == "eval"``). The words, from the
sources each sender writes (docs/cli.md, "check"):

``eval``
    an eval asked for it: a source ``eval`` or ``eval:<anything>`` (the demo's
    ``examples/eval_accuracy.py`` sends ``eval:eval_accuracy.py``), or ``ilab-journal
    control`` run without ``--source`` by a watcher command hook on a ``save``,
    ``evaluate`` or ``report`` (its source is then ``hook:<event>:<delivery id>``).
``early_stopping`` / ``divergence``
    the built-in ``EarlyStopping`` / ``DivergenceDetector`` of a watcher
    (``watcher:<cursor>:...EarlyStopping.on_evaluate``) or of ``run_training``.
``callback``
    any other Python callback a watcher runs (a callback class, a function hook, the
    InstructLab and training_hub callbacks): ``watcher:<cursor>:<hook>`` or
    ``run_training:<hook>``.
``hook``
    ``ilab-journal control`` run by a command hook on another event (``hook:log:...``).
``web``
    the ``ilab-journal serve`` page: a source ``web`` or ``web:<who>``.
``operator``
    anyone else: ``ilab-journal control``'s default ``<host>:<pid>``, or a ``--source``
    of one's own.
``trainer``
    ``stopped`` with no command: the trainer (or the bridged trainer) ended it itself.
``signal``
    ``interrupted``: a signal (Ctrl-C, SIGTERM from a scheduler).
``hang``
    the hang guard of a watcher or of ``run_training`` (``--on-hang abort``) ended an
    attempt that made no progress: its ``train_end`` (``failed``, written by the launcher
    or the watcher) says ``aborted_for: "hang"``, ``aborted_by`` who, and ``alert_id``
    where the evidence is (docs/alerts.md).
"""

from __future__ import annotations

from typing import Any

STOP_KINDS = (
    "eval",
    "early_stopping",
    "divergence",
    "callback",
    "hook",
    "web",
    "operator",
    "trainer",
    "signal",
    "hang",
)
#: A command hook's events whose stop is an eval's.
_EVAL_EVENTS = frozenset({"save", "evaluate", "report"})
#: The source prefixes of Python callbacks: an ilab-watch's, and run_training's own watcher.
_CALLBACK_PREFIXES = ("watcher:", "run_training:")


def stop_kind(source: str | None) -> str:
    """The kind of sender a command ``source`` names (one of :data:`STOP_KINDS`)."""
    if not source:
        return "operator"
    head, _, rest = source.partition(":")
    if head == "eval":
        return "eval"
    if head == "web":
        return "web"
    if head == "hook":
        return "eval" if rest.partition(":")[0] in _EVAL_EVENTS else "hook"
    if source.startswith(_CALLBACK_PREFIXES):
        if "EarlyStopping.on_" in source:
            return "early_stopping"
        if "DivergenceDetector.on_" in source:
            return "divergence"
        return "callback"
    return "operator"


def hook_source(env: dict[str, str]) -> str | None:
    """``ilab-journal control``'s default source inside a watcher command hook (``$ILAB_*``
    set by the watcher): ``hook:<event>:<delivery id>``; None outside one."""
    event, delivery = env.get("ILAB_EVENT"), env.get("ILAB_DELIVERY_ID")
    if not event or not delivery:
        return None
    return f"hook:{event}:{delivery}"


def ending(data: dict[str, Any], sources: dict[str, str | None]) -> tuple[str | None, str | None]:
    """``(stop_source, stopped_by)`` of a ``train_end`` payload: the kind and the source
    string of what ended the run (``sources``: applied stop/abort commands' id -> source,
    for journals whose ``train_end`` has no ``command_source``, and for a stopped attempt
    whose ``train_end`` names no command: the last applied); ``(None, None)`` for a run that
    completed or failed on its own. An attempt the hang guard aborted is ``hang``."""
    status = data.get("status")
    if data.get("aborted_for") == "hang":
        by = data.get("aborted_by")
        return "hang", by if isinstance(by, str) else None
    if data.get("command") in ("stop", "abort"):
        by = data.get("command_source")
        if not isinstance(by, str):
            by = sources.get(str(data.get("command_id")))
        return stop_kind(by), by
    if status == "stopped" and sources:
        by = list(sources.values())[-1]
        return stop_kind(by), by
    if status == "stopped":
        return "trainer", None
    if status == "interrupted":
        return "signal", None
    return None, None
