"""The record check of a full scan: :func:`records_ok`, the rules of
journal/record/fields.py compiled into one function.

Every line a reader parses is checked against the envelope and payload types
(:func:`~journal.record.fields.record_problem`). A scan checks tens of thousands of records
per batch, and the table-driven check (a loop over the rules, a ``dict.get`` per field)
cost as much as parsing them. Here the same tables are turned, once, into straight-line
code: the envelope fetched with one ``itemgetter`` call, each type tested inline (``type(x)
is T`` for one type; one lookup in a frozenset of the types allowed for several, or for a
payload field that may be null), the payload rules of each event spelled out. It gives the
same verdict as ``record_problem(o) is None`` for every record (tests/test_record_checks.py
holds the two together), so a rule added to the tables is checked here too. It changes no
record: one that lacks an envelope field (a writer other than ours) and is valid all the
same is put in ``incomplete``, for the reader to complete
(:func:`journal.record.record.complete`).
"""

from __future__ import annotations

import functools
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import orjson

from journal.read.lines import MAX_LINE_BYTES
from journal.record.fields import ENVELOPE_TYPES, PAYLOAD_TYPES, payload_problem, record_problem

#: Events whose payload is left to :func:`payload_problem` (a value check, not only types).
_BY_VALUE = frozenset({"train_end"})

if TYPE_CHECKING:
    from collections.abc import Callable

    Check = Callable[[list[Any], list[Any]], bool]


class _Types:
    """The type tests of the generated source, and the type sets they name."""

    def __init__(self) -> None:
        self.sets: dict[str, frozenset[type]] = {}

    def test(self, var: str, types: tuple[type, ...], *, none_ok: bool) -> str:
        """Source of the test that ``var`` has one of ``types`` exactly (a bool is no
        int), or is None when ``none_ok``."""
        if len(types) == 1 and not none_ok:
            return f"type({var}) is {types[0].__name__}"
        allowed = frozenset([*types, type(None)] if none_ok else types)
        name = "_" + "_".join(sorted(t.__name__ for t in allowed))
        self.sets[name] = allowed
        return f"type({var}) in {name}"


def _source() -> tuple[str, tuple[str, ...], dict[str, frozenset[type]]]:
    """The source of ``records_ok``, the envelope fields its ``itemgetter`` fetches, and the
    type sets its tests name."""
    types = _Types()
    env = tuple(ENVELOPE_TYPES)
    names = ("seq", "event", "data", *env)
    out = [
        "def records_ok(objs, incomplete):",
        "    for o in objs:",
        "        try:",
        f"            {', '.join('_' + n for n in names)} = _envelope(o)",
        "        except Exception:  # not a dict, or a field absent: the general check",
        "            if _record_problem(o) is not None:",
        "                return False",
        "            incomplete.append(o)  # valid, a field left out: the reader completes it",
        "            continue",
        "        if not (",
        "            type(_seq) is int and _seq >= 0 and type(_event) is str and type(_data) is dict",
    ]
    out += [f"            and {types.test('_' + n, ENVELOPE_TYPES[n], none_ok=False)}" for n in env]
    out += [
        "        ):",
        "            return False",
        "        if _event not in _RULED:",
        "            continue",
    ]
    # the most common event first: the ``==`` tests are walked in order
    for ev in sorted(PAYLOAD_TYPES, key=lambda e: e != "log"):
        out.append(f"        if _event == {ev!r}:")
        if ev in _BY_VALUE:
            out += [
                "            if _payload_problem(_event, _data) is not None:",
                "                return False",
            ]
        else:
            out += ["            get = _data.get", "            if not ("]
            for i, (field, allowed) in enumerate(PAYLOAD_TYPES[ev].items()):
                test = types.test(f"get({field!r})", allowed, none_ok=True)
                out.append(f"                {'and ' if i else ''}{test}")
            out += ["            ):", "                return False"]
        out.append("            continue")
    out.append("    return True")
    return "\n".join(out) + "\n", names, types.sets


@functools.cache  # compiled once, at its first use
def _compile() -> Check:
    source, names, sets = _source()
    namespace: dict[str, Any] = {
        "_envelope": itemgetter(*names),
        "_record_problem": record_problem,
        "_payload_problem": payload_problem,
        "_RULED": frozenset(PAYLOAD_TYPES),
        **sets,
    }
    exec(compile(source, f"<{__name__}.records_ok>", "exec"), namespace)
    fn: Check = namespace["records_ok"]
    fn.__doc__ = "Whether ``record_problem`` finds nothing in any of ``objs`` (module doc)."
    return fn


def records_ok(objs: list[Any], incomplete: list[Any] | None = None) -> bool:
    """Whether ``record_problem`` finds nothing in any of ``objs`` (module doc); the valid
    ones that lack an envelope field are appended to ``incomplete`` (when given). The check
    is compiled at its first use, not at import: ``status`` reads a few records and need
    not pay for it."""
    return _compile()(objs, [] if incomplete is None else incomplete)


def load_checked(
    lines: list[bytes], size: int, incomplete: list[dict[str, Any]]
) -> list[Any] | None:
    """The records of ``lines`` (``size`` bytes with their newlines), when every one is a
    valid record (those lacking an envelope field put in ``incomplete``); else None. The
    line path's check (journal/read/reader.py), and the checker's
    (journal/read/precheck.py: ``vouchable``)."""
    if size > MAX_LINE_BYTES and max(map(len, lines)) > MAX_LINE_BYTES:
        return None
    try:
        objs = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:  # a bad line (a blank one too): the slow path
        return None
    return objs if records_ok(objs, incomplete) else None
