"""Which lines are records: the envelope, and the JSON types of the fields readers use.

A line whose fields have the wrong JSON type (``"ts": "yesterday"``, ``"step": {}``, a
report's ``"metrics": "x"``, a train_begin's ``"config": "str"``) is not a record: readers
skip it and count it as an invalid line, so it can neither crash a reader nor turn
``status`` into "failed". Only types are checked, only of fields that are present (and, in
payloads, not null): absent fields stay tolerated, and a reader hands the record out
complete (journal/record/record.py: an envelope field left out gets its default). Every rule
here is one the schema (journal/record/schema.py) has too, so a record these checks skip is
never a valid one (tests/test_readers_hardening.py holds the two together). What a record
needs besides to be acted on (a hook, a lease) is :func:`missing_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from journal.record.events import END_STATUSES
from journal.record.record import ENVELOPE_DEFAULTS

_INT: tuple[type, ...] = (int,)  # checked with type(), so True/False are not ints
_NUM: tuple[type, ...] = (int, float)
_STR: tuple[type, ...] = (str,)
_DICT: tuple[type, ...] = (dict,)
_BOOL: tuple[type, ...] = (bool,)
_EMPTY: dict[str, Any] = {}

#: Envelope fields other than seq/event/data: their JSON type when present (null is wrong).
ENVELOPE_TYPES: dict[str, tuple[type, ...]] = {
    "v": _INT,
    "run_id": _STR,
    "attempt": _INT,
    "ts": _NUM,
    "step": _INT,
    "epoch": _INT,
    "samples_seen": _INT,
}

#: Per event, the payload fields readers use and their JSON type when present and not null.
PAYLOAD_TYPES: dict[str, dict[str, tuple[type, ...]]] = {
    "train_begin": {
        "config": _DICT,
        "total_steps": _INT,
        "world_size": _INT,
        "hostname": _STR,
        "pid": _INT,
        "resumed_from": _STR,
    },
    "log": {
        "loss": _NUM,
        "lr": _NUM,
        "grad_norm": _NUM,
        "elapsed_time": _NUM,
        "tokens_per_s": _NUM,
        "samples_per_s": _NUM,
        "batch_metrics": _DICT,
    },
    "evaluate": {"val_loss": _NUM, "duration": _NUM},
    "save": {"checkpoint_path": _STR, "hf_path": _STR, "duration": _NUM},
    "report": {
        "id": _STR,
        "checkpoint_path": _STR,
        "step": _INT,
        "metrics": _DICT,
        "source": _STR,
    },
    "train_end": {
        "status": _STR,
        "reason": _STR,
        "final_checkpoint": _STR,
        "error_type": _STR,
        "error_message": _STR,
        "best_checkpoint": _DICT,
    },
    "control": {
        "command": _STR,
        "id": _STR,
        "source": _STR,
        "reason": _STR,
        "accepted": _BOOL,
        "applied_at_step": _INT,
    },
    "checkpoint_removed": {"checkpoint_path": _STR, "reason": _STR},
    "journal_gap": {"dropped": _INT, "first_seq": _INT, "last_seq": _INT, "error": _STR},
}


def record_problem(obj: Any) -> str | None:
    """The reason an object is not a record, or None when it is one."""
    if type(obj) is not dict:
        return "not a JSON object"
    seq = obj.get("seq")
    if type(seq) is not int or seq < 0:
        return "missing or invalid 'seq'"
    event = obj.get("event")
    if type(event) is not str:
        return "missing or invalid 'event'"
    data = obj.get("data", _EMPTY)
    if type(data) is not dict:
        return "'data' is not an object"
    for name, types in ENVELOPE_TYPES.items():
        if name in obj and type(obj[name]) not in types:
            return f"{name!r} is {_json_type(obj[name])}, expected {_expected(types)}"
    return payload_problem(event, data)


def payload_problem(event: str, data: dict[str, Any]) -> str | None:
    """The reason a payload breaks the types readers rely on, or None."""
    rules = PAYLOAD_TYPES.get(event)
    if rules is None:
        return None
    for name, types in rules.items():
        value = data.get(name)
        if value is not None and type(value) not in types:
            return f"'data.{name}' is {_json_type(value)}, expected {_expected(types)}"
    if event == "train_end" and "status" in data and data["status"] not in END_STATUSES:
        return f"'data.status' {data['status']!r} is not one of {', '.join(END_STATUSES)}"
    return None


#: Envelope fields no default stands in for: a completed record has None there when its
#: writer left them out (which run? when?).
UNDEFAULTED: tuple[str, ...] = tuple(n for n, v in ENVELOPE_DEFAULTS.items() if v is None)

#: Per event, the payload fields nothing can act on its record without (a save's hooks
#: evaluate its checkpoint, the watcher leases it). The schema requires them too.
NEEDED: dict[str, tuple[str, ...]] = {"save": ("checkpoint_path",)}


def accepted(data: Mapping[str, Any]) -> bool:
    """A ``control`` verdict's one rule, for every view: the command was applied only when
    ``accepted`` is true (the schema requires the field; a record without it applied
    nothing)."""
    return data.get("accepted") is True


def missing_fields(rec: Mapping[str, Any]) -> list[str]:
    """What a record (valid, completed or not) lacks to be acted on: the :data:`UNDEFAULTED`
    envelope fields absent or None, then ``data.<field>`` for each :data:`NEEDED` one of its
    event absent or null (``["run_id", "data.checkpoint_path"]``); ``[]``: nothing."""
    missing = [name for name in UNDEFAULTED if rec.get(name) is None]
    needed = NEEDED.get(rec.get("event"))  # type: ignore[arg-type]
    if needed:
        data = rec.get("data") or _EMPTY
        missing += [f"data.{name}" for name in needed if data.get(name) is None]
    return missing


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    return names.get(type(value), "a number")


def _expected(types: tuple[type, ...]) -> str:
    if types is _NUM:
        return "a number"
    return {int: "an integer", str: "a string", dict: "an object", bool: "a boolean"}[types[0]]
