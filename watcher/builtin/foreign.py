"""InstructLab's and training_hub's own callbacks, run unchanged by the watcher.

instructlab-training 0.16.2's ``TrainerCallback`` (hooks given one ``TrainingContext``) and
training-hub 0.11.2's ``TrainingHubCallback`` (given one ``TrainingHubContext``) are run
here as they are: :class:`ForeignCallback` wraps one such object into a callback object
with ``on_<event>`` methods, which the watcher calls in journal order on one queue (every
record: ``deliver_every_record``). Each hook gets the context its own trainer would give
it, filled from the journal's records by :class:`ContextState`, as instructlab-training's
loop fills it; a hub callback's context is built from that one by training_hub's own
``build_hub_context_from_native`` (``metrics`` flattened, ``checkpoint_path`` among them on
save). Nothing is serialized: instance state, closures and classes defined in a function
all work. Hooks fire once, in one process: ``is_world_process_zero`` is true.

What they may return or set becomes a control command (applied on every rank at the same
step): our :class:`journal.Control` returned by a hook, and a hub callback's
``context.control.should_save`` / ``should_training_stop``. Other return values are ignored,
as their trainers ignore them, except ``Control.stop`` without its ``()``, which fails the
delivery saying so; an ``async def`` hook is run to its end, as instructlab-training awaits
it. A command asked for at ``on_train_end`` cannot be applied: it is journaled as rejected
(watcher.engine.handback), not left in ``control/``.

Neither package is imported here until an object of theirs is given (its module is then
loaded already): the watcher does not depend on them.
"""

from __future__ import annotations

import inspect
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.channels.control import Control
from journal.record.record import Record
from journal.rundir.files import atomic_write
from watcher.hooks.callbacks import ACTIONS, Event, forgot_call

#: instructlab-training's hooks (callbacks.HOOK_NAMES), in its order: the journal event that
#: fires each, and where it is hooked too: "hub" (training_hub has it:
#: adapters.distributed.HUB_HOOKS, InstructLab's but those around the forward pass and the
#: optimizer step), "step" (within a step: a control command it sends is awaited by the next
#: step, callback pacing, so it applies at that step on every rank), "micro" (per
#: micro-batch: it needs ``journal_detail="microbatch"``).
_HOOKS = [
    ("on_train_begin", "train_begin", ("hub",)),
    ("on_epoch_begin", "epoch_begin", ("hub",)),
    ("on_step_begin", "step_begin", ("hub", "step")),
    ("on_before_forward", "before_forward", ("step", "micro")),
    ("on_after_backward", "after_backward", ("step", "micro")),
    ("on_pre_optimizer_step", "before_optimizer_step", ("step",)),
    ("on_optimizer_step", "after_optimizer_step", ("step",)),
    ("on_log", "log", ("hub", "step")),
    ("on_evaluate", "evaluate", ("hub", "step")),
    ("on_save", "save", ("hub",)),
    ("on_step_end", "step_end", ("hub", "step")),
    ("on_epoch_end", "epoch_end", ("hub",)),
    ("on_train_end", "train_end", ("hub",)),
]
ILAB_HOOKS = {hook: event for hook, event, _ in _HOOKS}
HUB_HOOKS = tuple(hook for hook, _, where in _HOOKS if "hub" in where)
STEP_HOOKS = frozenset(hook for hook, _, where in _HOOKS if "step" in where)
MICROBATCH_HOOKS = frozenset(hook for hook, _, where in _HOOKS if "micro" in where)
#: The records the context is filled from, whatever the callback hooks.
STATE_EVENTS = frozenset({"train_begin", "log", "evaluate"})
#: The fields of a log record's ``batch_metrics`` that a ``TrainingContext`` keeps.
_BATCH_METRICS = (
    "total_samples",
    "total_length",
    "num_loss_counted_tokens",
    "grad_accum_steps",
    "num_minibatches",
)
_BASES = {
    ("instructlab.training.callbacks", "TrainerCallback"): "instructlab",
    ("training_hub.callbacks", "TrainingHubCallback"): "training_hub",
}


def foreign_base(obj: Any) -> tuple[str, type] | None:
    """``("instructlab" | "training_hub", base class)`` for an object or class of theirs."""
    cls = obj if isinstance(obj, type) else type(obj)
    for base in cls.__mro__:
        kind = _BASES.get((base.__module__, base.__qualname__))
        if kind is not None:
            return kind, base
    return None


def overridden_hooks(obj: Any) -> list[str]:
    """The hooks a callback of theirs overrides, tested as their managers test it."""
    found = foreign_base(obj)
    if found is None:
        return []
    kind, base = found
    names = ILAB_HOOKS if kind == "instructlab" else HUB_HOOKS
    cls = obj if isinstance(obj, type) else type(obj)
    return [h for h in names if getattr(cls, h, None) is not getattr(base, h, None)]


class Progress:
    """The step up to which every paced callback has handled the journal, in one file that
    rank 0 reads before each step's all-reduce (trainer/steering/callback_pacing.py);
    ``path`` is below the run dir ``root``."""

    def __init__(self, path: Path, root: Path) -> None:
        self.path, self.root = path, root
        self._done: dict[int, int] = {}
        self._written = -1
        self._lock = threading.Lock()
        self.write(0)

    def register(self, owner: object) -> None:
        with self._lock:
            self._done[id(owner)] = 0

    def done(self, owner: object, step: int) -> None:
        with self._lock:
            self._done[id(owner)] = step
            low = min(self._done.values())
            if low > self._written:
                self.write(low)

    def write(self, step: int) -> None:
        self._written = step
        atomic_write(self.path, str(step).encode(), root=self.root, durable=False)


@dataclass
class ContextState:
    """instructlab-training's ``TrainingContext`` fields, kept as its loop keeps them."""

    values: dict[str, Any] = field(default_factory=dict)

    def fold(self, event: Event) -> None:
        """Fold one record in (every record, hooked or not, in journal order)."""
        v, data = self.values, event.data
        if event.name == "train_begin":  # each attempt starts afresh, as train() does
            config = data.get("config") or {}
            v.clear()
            v.update(
                output_dir=event.ckpt_dir,
                model_name_or_path=str(config.get("model_path") or ""),
                max_epochs=int(config.get("num_epochs") or 0),
                world_size=int(data.get("world_size") or 1),
                total_samples=event.samples_seen,
                total_tokens=0,
                step=event.step + 1,  # its global_step: the step about to run
                epoch=event.epoch,
            )
            return
        v.update(step=event.step, epoch=event.epoch)
        if event.name == "log":
            batch = data.get("batch_metrics") or {}
            mem = data.get("cuda_mem_allocated")
            v.update(
                total_samples=data.get("samples_seen", event.samples_seen),
                total_tokens=v.get("total_tokens", 0) + int(batch.get("total_length") or 0),
                loss=data.get("loss"),
                learning_rate=data.get("lr"),
                grad_norm=data.get("grad_norm"),
                elapsed_time=data.get("elapsed_time"),
                overall_throughput=data.get("samples_per_s"),
                cuda_mem_allocated=None if mem is None else mem / 1024**3,  # GiB, as theirs
                batch_metrics={k: batch[k] for k in _BATCH_METRICS if k in batch},
            )
        elif event.name == "evaluate":
            v["val_metrics"] = {
                k: data[k] for k in ("val_loss", "val_num_tokens") if data.get(k) is not None
            }

    def snapshot(self, hook: str, event: Event) -> Any:
        """The context one hook gets: theirs (a copy), ``checkpoint_path`` set on save."""
        fields = {
            **self.values,
            "hook_name": hook,
            "batch_metrics": dict(self.values.get("batch_metrics") or {}),
            "val_metrics": dict(self.values.get("val_metrics") or {}),
            "is_local_process_zero": True,  # hooks fire once, in the launching process
            "is_world_process_zero": True,
        }
        if event.name == "save":  # the loadable model when there is one, as theirs names
            fields["checkpoint_path"] = event.data.get("hf_path") or event.data.get(
                "checkpoint_path"
            )
        module = sys.modules.get("instructlab.training.callbacks")
        if module is not None:
            return module.TrainingContext(**fields)
        from types import SimpleNamespace

        return SimpleNamespace(**{"checkpoint_path": None, **fields})


class ForeignCallback:
    """One InstructLab or training_hub callback object as a watcher callback object.

    Args:
        callback: the user's object (never copied).
        progress: where paced runs record the steps handled (:class:`Progress`), or None.
    """

    #: its name in cursors and results, fixed whatever module it lives in
    CURSOR_LABEL = "watcher.foreign.ForeignCallback"

    deliver_every_record = True  # every record, never coalesced: theirs see every step

    def __init__(self, callback: Any, progress: Progress | None = None) -> None:
        found = foreign_base(callback)
        if found is None:
            raise TypeError(f"{type(callback).__name__} is not an InstructLab callback")
        self.kind = found[0]
        self.callback = callback
        self.callback_label = f"{type(callback).__module__}.{type(callback).__qualname__}"
        self.hooks = overridden_hooks(callback)
        self.paced = progress is not None and bool(STEP_HOOKS & set(self.hooks))
        self.progress = progress if self.paced else None
        if self.progress is not None:
            self.progress.register(self)
        self.by_event = {ILAB_HOOKS[h]: h for h in self.hooks}
        self.subscribed_events = {*self.by_event, *STATE_EVENTS}
        if self.paced:
            self.subscribed_events.add("step_end")
        #: read only to fill the context: not the user's hooks (left out of cursor names)
        self.context_events = self.subscribed_events - set(self.by_event)
        self.state = ContextState()
        self._hub_control: Any = None
        self._stop_sent = False

    def handle(self, event: Event, **_data: Any) -> Any:
        """Fold the record into the context, then call the hook of its event (if any)."""
        try:
            self.state.fold(event)
            if event.name == "train_begin":  # a new attempt: a fresh control bag
                self._hub_control, self._stop_sent = None, False
            hook = self.by_event.get(event.name)
            if hook is None:
                return None
            ctx = self.state.snapshot(hook, event)
            if self.kind == "instructlab":
                return self._actions(_run(getattr(self.callback, hook)(ctx)))
            return self._call_hub(hook, ctx)
        finally:
            if self.progress is not None and event.name == "step_end":
                self.progress.done(self, event.step)

    def _call_hub(self, hook: str, native: Any) -> Any:
        """As training_hub's adapters call a hub hook; its control flags become commands."""
        from training_hub.adapters.distributed import build_hub_context_from_native
        from training_hub.callbacks import TrainingHubControl

        ctx = build_hub_context_from_native(native)
        if self._hub_control is None:
            self._hub_control = TrainingHubControl()
        ctx.control = self._hub_control
        out = self._actions(getattr(self.callback, hook)(ctx))
        name = f"{self.callback_label}.{hook}"
        if ctx.control.should_save:
            ctx.control.should_save = False  # once per request, as the unsloth adapter does
            out.append(Control.save(f"{name}: control.should_save"))
        if ctx.control.should_training_stop and not self._stop_sent:
            self._stop_sent = True
            out.append(Control.stop(f"{name}: control.should_training_stop"))
        return out

    @staticmethod
    def _actions(returned: Any) -> list[Any]:
        """Our Controls and Reports among what a hook of theirs returned. Their trainers
        ignore return values, so anything else is left out too, but for ``Control.stop``
        without its ``()`` (a stop the user meant): kept, it fails the delivery, saying so
        (watcher.hooks.callbacks.returned_actions)."""
        items = list(returned) if isinstance(returned, (list, tuple)) else [returned]
        return [x for x in items if isinstance(x, ACTIONS) or forgot_call(x) is not None]

    def restore_state(self, records: list[Record]) -> None:
        """The context as it stood before the first delivered record."""
        for rec in records:
            self.state.fold(Event.from_record(rec, "", ""))

    def __getattr__(self, name: str) -> Any:
        # on_<event> for every subscribed event: the watcher reads the callback contract
        # once (watcher.hooks.contract.read_callback), asking only for subscribed_events
        if name.startswith("on_") and name[3:] in self.__dict__.get("subscribed_events", ()):
            return self.handle
        raise AttributeError(name)


def _run(returned: Any) -> Any:
    """What a hook returned, an ``async def`` hook's coroutine run to its end first (the
    watcher's worker thread runs no event loop of its own)."""
    if not inspect.iscoroutine(returned):
        return returned
    import asyncio  # an async callback's only: 18 ms of every start otherwise

    return asyncio.run(returned)


def adapt(callbacks: list[Any], progress: Progress | None = None) -> list[Any]:
    """``callbacks`` with every InstructLab or training_hub object (or class, constructed
    with no arguments) wrapped in a :class:`ForeignCallback`; others as they are."""
    out = []
    for cb in callbacks:
        if foreign_base(cb) is None:
            out.append(cb)
        else:
            out.append(ForeignCallback(cb() if isinstance(cb, type) else cb, progress))
    return out


def microbatch_hooks(callbacks: list[Any]) -> list[str]:
    """``module.Class.hook`` of each per-micro-batch hook the callbacks override."""
    return [
        f"{type(cb).__module__}.{type(cb).__qualname__}.{h}"
        for cb in callbacks
        for h in overridden_hooks(cb)
        if h in MICROBATCH_HOOKS
    ]


def wants_pacing(callbacks: list[Any]) -> bool:
    """Whether a callback of theirs hooks a point within a step (see :data:`STEP_HOOKS`)."""
    return any(STEP_HOOKS & set(overridden_hooks(cb)) for cb in callbacks)
