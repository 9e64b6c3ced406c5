"""What a hook runs: external commands, Python callables and class-based callbacks.

Commands never go through a shell unless asked (``shell=True``): ``{name}`` placeholders are
replaced inside argv items, so a checkpoint path such as ``/ck/a; rm -rf x`` reaches the
program as one verbatim argument and executes nothing.
"""

from __future__ import annotations

import inspect
import os
import re
import reprlib
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.channels.control import Control
from journal.channels.reports import Report
from journal.record.events import ENVELOPE_FIELDS
from journal.record.record import Record, complete

_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Names a placeholder may use besides the envelope and the event's payload fields.
EXTRA_FIELDS = ("ckpt_dir", "delivery_id", "journal")


class CallbackSpecError(ValueError):
    """A hook specification is unusable (reported as a usage error before tailing starts)."""


#: The key of its record that an event made by :meth:`Event.of` reads each field from, on
#: first use (a reader's record has every one: journal/record/record.py).
_FROM_RECORD = {f: f for f in ENVELOPE_FIELDS if f not in ("v", "event", "data")}
_FROM_RECORD["name"] = "event"
_new, _set = object.__new__, object.__setattr__  # Event.of: two C calls and a dict


def delivery_id_for(rec: Record, short_id: str) -> str:
    """A delivery's id, stable across restarts: the record's run id and seq, and its hook's
    ``short_id`` (watcher.hooks.hook.Hook)."""
    return f"{rec['run_id']}-{rec['seq']}-{short_id}"


@dataclass(frozen=True)
class Event:
    """What a Python callback receives as its first argument.

    ``str(event)`` is the event name; ``event.data`` the payload, whose fields are also
    passed as keyword arguments (``checkpoint_path=...`` for save, ``val_loss=...`` for
    evaluate).
    """

    name: str
    seq: int
    step: int
    epoch: int
    samples_seen: int
    run_id: str  # a delivered record always has its run id and time (delivery.undeliverable)
    attempt: int
    ts: float
    data: dict[str, Any]
    ckpt_dir: str
    delivery_id: str
    record: Record = field(repr=False)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def from_record(cls, rec: Mapping[str, Any], ckpt_dir: str, delivery_id: str) -> Event:
        """The event of record ``rec`` for the delivery ``delivery_id`` (as :meth:`of`); an
        envelope field ``rec`` lacks (one made by hand) gets its default, as a reader's would."""
        record = complete(dict(rec))
        event = cls.of(record, ckpt_dir, record["data"], None)
        event.__dict__["delivery_id"] = delivery_id
        del event.__dict__["_hook"]
        return event

    @classmethod
    def of(cls, rec: Record, ckpt_dir: str, data: dict[str, Any], hook: Any) -> Event:
        """The event the watcher hands a callable (once per delivery: a replay makes
        millions): it holds the record and reads the other fields from it on first use
        (:meth:`__getattr__`), ``delivery_id`` made from ``hook``'s ``short_id`` too. Not
        through the frozen ``__init__`` (3x slower); what callbacks get is as frozen, with
        the same fields, as ever."""
        event = _new(cls)
        _set(event, "__dict__", {"record": rec, "ckpt_dir": ckpt_dir, "data": data, "_hook": hook})
        return event

    def __getattr__(self, name: str) -> Any:
        # Reached only for a field not read yet (Event.of): read, then kept.
        d = self.__dict__
        rec = d.get("record")
        if rec is not None:
            if (key := _FROM_RECORD.get(name)) is not None:
                value = d[name] = rec[key]
                return value
            if name == "delivery_id" and "_hook" in d:
                value = d[name] = delivery_id_for(rec, d["_hook"].short_id)
                return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        """Every field read (a copy or a pickle is a whole event)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


class TrainerCallback:
    """Base class for class-based callbacks: override the ``on_<event>`` methods you need.

    Every method receives the :class:`Event` and the payload fields as keyword arguments,
    and may return a :class:`journal.Control` (e.g. ``Control.stop("diverged")``) to steer
    training: the command applies at the next step boundary on every rank; or a
    :class:`journal.Report` (``Report(accuracy=0.81)``) with results for the checkpoint of
    the event; or a list of both. Constructor
    arguments, closures and module-level imports all work: the object runs in the watcher's
    process and is never serialized.

    Only overridden methods are hooked; the defaults below are no-ops. Each one is called
    once per journal record of its event, in journal order, after the trainer wrote it
    (deferred intra-step records reach the journal with their step's ``step_end``). The
    methods of one object share one queue: they are called one at a time, in journal order
    (``on_train_end`` after every earlier record), and a slow one delays only this object.
    A high-rate event's pending record may be coalesced into a newer one, never across a
    pending record of another kind (docs/python-api.md, "Order for one object").
    """

    def on_train_begin(self, event: Event, **data: Any) -> Any:
        """Fires when an attempt starts (a resume is a new attempt), after the model, data
        and checkpoint are loaded; ``data`` has config, world_size, total_steps."""

    def on_epoch_begin(self, event: Event, **data: Any) -> Any:
        """Fires when an epoch starts (also when a resume lands inside one)."""

    def on_step_begin(self, event: Event, **data: Any) -> Any:
        """Fires when an optimizer step starts, before its first micro-batch."""

    def on_before_forward(self, event: Event, **data: Any) -> Any:
        """Fires when a micro-batch is about to run forward (``journal_detail="microbatch"``)."""

    def on_after_forward(self, event: Event, **data: Any) -> Any:
        """Fires when a micro-batch's forward pass is done (``journal_detail="microbatch"``)."""

    def on_before_backward(self, event: Event, **data: Any) -> Any:
        """Fires when a micro-batch is about to run backward (``journal_detail="microbatch"``)."""

    def on_after_backward(self, event: Event, **data: Any) -> Any:
        """Fires when a micro-batch's backward pass is done (``journal_detail="microbatch"``)."""

    def on_before_optimizer_step(self, event: Event, **data: Any) -> Any:
        """Fires when the last backward is done, before gradient clipping and the step."""

    def on_after_optimizer_step(self, event: Event, **data: Any) -> Any:
        """Fires when ``optimizer.step()``, the scheduler step and ``zero_grad()`` are done:
        this fires after ``zero_grad``, so the gradients are gone; the new weights are in."""

    def on_log(self, event: Event, **data: Any) -> Any:
        """Fires when a log record is written (every ``log_every`` steps, or on a ``log``
        command), with the step's loss, lr, grad_norm and throughput over all ranks."""

    def on_evaluate(self, event: Event, **data: Any) -> Any:
        """Fires when validation ran (every ``eval_every`` steps or on an ``evaluate``
        command), with ``val_loss``."""

    def on_save(self, event: Event, **data: Any) -> Any:
        """Fires when a checkpoint is complete on disk on every rank: ``checkpoint_path``
        (and ``hf_path`` for the consolidated model) can be loaded right away."""

    def on_step_end(self, event: Event, **data: Any) -> Any:
        """Fires when an optimizer step is over: after that step's log and evaluate. Its
        ``save`` may come later: an asynchronous save (the default) is recorded when its
        background write is complete, at a later step boundary or before ``train_end``
        (docs/journal-format.md); a synchronous save comes before this record."""

    def on_epoch_end(self, event: Event, **data: Any) -> Any:
        """Fires when an epoch's last step is over."""

    def on_train_end(self, event: Event, **data: Any) -> Any:
        """Fires when an attempt ends, on every exit path: ``status`` is completed, stopped,
        failed or interrupted, with ``reason`` and ``final_checkpoint``."""

    def on_control(self, event: Event, **data: Any) -> Any:
        """Fires when the trainer accepted (and applied) or rejected a control command."""

    def on_report(self, event: Event, **data: Any) -> Any:
        """Fires when results for a checkpoint were journaled (``metrics``,
        ``checkpoint_path``, ``step``, ``source``), also after training ended."""

    def on_checkpoint_removed(self, event: Event, **data: Any) -> Any:
        """Fires when rotation deleted a checkpoint (``checkpoint_path``, ``reason``)."""

    def restore_state(self, records: list[Record]) -> None:
        """Called once, before live delivery, with the journal's records before the start
        position (not a delivery: no hook runs for them).

        Stateful callbacks (early stopping, divergence detection) rebuild their state here,
        so a restarted watcher or a resumed run keeps counters and best values.
        """


# -- what a callback returns -----------------------------------------------------------------


class BadReturn(TypeError):
    """A callback returned something that is neither None nor a :class:`Control` or
    :class:`Report` (or a list of them): its delivery fails with this one line."""


#: What a callback may return (alone, or in a list or tuple), besides None.
ACTIONS = (Control, Report)
_short = reprlib.Repr()
_short.maxstring = _short.maxother = 60


def forgot_call(value: Any) -> str | None:
    """What makes a Control or Report without being one (``Control.stop``, ``Report``),
    named as written, or None: returning it means a missing ``()``."""
    if isinstance(value, type) and issubclass(value, ACTIONS):
        return value.__name__
    if inspect.ismethod(value):  # Control.stop: a classmethod bound to the class
        owner = value.__self__
        cls = owner if isinstance(owner, type) else type(owner)
        if issubclass(cls, ACTIONS):
            return f"{cls.__name__}.{value.__name__}"
    return None


def returned_actions(returned: Any) -> list[Control | Report]:
    """The Controls and Reports a callback returned, in order (None: none). Anything else,
    alone or in a list, raises :class:`BadReturn` naming its type: a return value dropped
    without a word would be a ``stop`` that never happens (``return Control.stop``)."""
    if returned is None:
        return []
    many = isinstance(returned, (list, tuple))
    items = list(returned) if many else [returned]
    for i, item in enumerate(items):
        if isinstance(item, ACTIONS):
            continue
        where = f" (item {i} of the {type(returned).__name__} it returned)" if many else ""
        if (name := forgot_call(item)) is not None:
            kind = "the class" if isinstance(item, type) else "the method"
            made = name.split(".")[0]
            raise BadReturn(f"returned {kind} {name}{where}, not a {made}: did you forget the ()?")
        what = type(item).__name__
        if inspect.isgenerator(item) or inspect.iscoroutine(item):
            what = f"a {what} (a function with yield or async def)"  # its repr says no more
        else:
            what += f" {_short.repr(item)}"
        raise BadReturn(
            f"returned {what}{where}: a callback returns None, a Control, a Report, or a "
            "list of them"
        )
    return items


def callable_name(fn: Any) -> str:
    """``module.QualName`` of a function, method, class or instance (a string as itself).
    This name makes the default cursor name and a callback's label in results, which must
    outlive a refactoring: a built-in callback class says its own with a ``CURSOR_LABEL``
    (a subclass names itself)."""
    if isinstance(fn, str):
        return fn
    owner = getattr(fn, "__self__", None)  # a bound method: its object's class and name
    cls = fn if isinstance(fn, type) else type(owner if owner is not None else fn)
    fixed = vars(cls).get("CURSOR_LABEL")
    if isinstance(fixed, str):
        return f"{fixed}.{fn.__name__}" if owner is not None else fixed
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    mod = getattr(fn, "__module__", None) or type(fn).__module__
    return f"{mod}.{name}"


# -- external commands ----------------------------------------------------------------------


def known_fields(event: str) -> set[str]:
    # the schema's models load pydantic (80 ms): only a command hook's placeholders ask
    from journal.record.schema import PAYLOAD_MODELS

    names = set(ENVELOPE_FIELDS) | set(EXTRA_FIELDS)
    model = PAYLOAD_MODELS.get(event)
    if model is not None:
        names |= set(model.model_fields)
    return names


@dataclass(frozen=True)
class CommandTarget:
    """An external program run once per delivery."""

    spec: str  # as the user wrote it
    argv: tuple[str, ...]  # template items, placeholders unresolved
    shell: bool = False

    @classmethod
    def parse(cls, spec: str, event: str, *, shell: bool = False) -> CommandTarget:
        if not spec.strip():
            raise CallbackSpecError(f"--on-{event}: empty command")
        allowed = known_fields(event)
        for m in _PLACEHOLDER.finditer(spec):
            name = m.group(1)
            if name is not None and name not in allowed:
                raise CallbackSpecError(
                    f"{spec!r}: unknown placeholder {{{name}}} for event {event!r}; "
                    f"known: {', '.join(sorted(allowed))}"
                )
        if shell:
            return cls(spec, (spec,), shell=True)
        try:
            items = shlex.split(spec)
        except ValueError as exc:
            raise CallbackSpecError(f"{spec!r}: cannot split into arguments: {exc}") from None
        prog = items[0]
        if prog.endswith(".py"):
            if not Path(prog).is_file():
                raise CallbackSpecError(f"{spec!r}: script {prog} not found")
            items = [sys.executable, str(Path(prog).resolve()), *items[1:]]
        elif "{" not in prog:
            if os.sep in prog:
                if not (Path(prog).is_file() and os.access(prog, os.X_OK)):
                    raise CallbackSpecError(f"{spec!r}: {prog} is not an executable file")
                items[0] = os.path.abspath(prog)  # not resolve(): a venv's python is a symlink
            elif shutil.which(prog) is None:
                raise CallbackSpecError(f"{spec!r}: command {prog!r} not found on PATH")
        return cls(spec, tuple(items), shell=False)

    def render(self, values: dict[str, Any]) -> list[str]:
        """The argv for one delivery (each template item stays exactly one item)."""
        quote = shlex.quote if self.shell else (lambda s: s)

        def sub(m: re.Match[str]) -> str:
            tok = m.group(0)
            if tok == "{{":
                return "{"
            if tok == "}}":
                return "}"
            v = values.get(m.group(1))
            return quote("" if v is None else str(v))

        items = [_PLACEHOLDER.sub(sub, item) for item in self.argv]
        return ["/bin/sh", "-c", items[0]] if self.shell else items


def check_callable(fn: Any, where: str) -> None:
    """A Python callback must accept the event plus keyword arguments."""
    if not callable(fn):
        raise CallbackSpecError(f"{where}: {fn!r} is not callable")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    params = list(sig.parameters.values())
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    if not positional:
        raise CallbackSpecError(
            f"{where}: {callable_name(fn)} must accept the event as first argument"
        )
