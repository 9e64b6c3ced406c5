"""Numbers a user types (an option, a setting inside ``--early-stopping``, a literal in
``check``'s expressions): judged in one place, finite, of the right kind and in range, or
refused with words saying what was expected. Everything here is plain Python: the click
types built on it are in ``journal/cli/common.py``."""

from __future__ import annotations

import math
from typing import Any

from journal.record.text import printable

#: Digits (and signs, dots, exponents) a number typed by hand may have. Python refuses
#: int() past 4300 digits (a ValueError); float() makes inf of 400. Both are refused here.
MAX_NUMBER_CHARS = 100


def number_range(low: float | None, high: float | None, low_open: bool = False) -> str:
    """``1 or more``, ``more than 0 and at most 1``, ``0 to 86400``: a range in words."""
    if low is None:
        return "" if high is None else f"at most {high:.15g}"
    if low_open:
        low_text = f"more than {low:.15g}"
        return low_text if high is None else f"{low_text} and at most {high:.15g}"
    return f"{low:.15g} or more" if high is None else f"{low:.15g} to {high:.15g}"


def parse_number(
    value: Any,
    *,
    whole: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    noun: str | None = None,
) -> Any:
    """``value`` (text as typed, or a number) as a finite number in the range: an int when
    ``whole`` (``2.9`` is refused, not cut to 2), else a float. The one place every
    number a user types is judged: a click option (:class:`Number`, :class:`Seconds`), a
    setting inside ``--early-stopping``, ``--ray-resources`` or a backtest sweep.

    Raises ValueError saying what was expected (``a whole number, 1 or more``); the
    caller names the option."""
    number: float | int | None = None
    if isinstance(value, str) and len(value.strip()) <= MAX_NUMBER_CHARS:
        try:
            number = int(value) if whole else float(value)
        except ValueError:
            number = None
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
        if whole and isinstance(value, float):
            number = int(value) if value.is_integer() else None
    fits = number is not None and (
        math.isfinite(number)
        and (low is None or (number > low if low_open else number >= low))
        and (high is None or number <= high)
    )
    if not fits:
        kind = noun or ("a whole number" if whole else "a finite number")
        where = number_range(low, high, low_open)
        raise ValueError(f"expected {kind}" + (f", {where}" if where else ""))
    return int(number) if whole else float(number)  # type: ignore[arg-type]


def seconds_or_auto(value: str) -> float | None:
    """``--hang-after``'s form: ``auto`` (None) or a finite number of seconds above 0,
    judged by :func:`parse_number`. Raises ValueError saying what was expected."""
    if value.strip().lower() == "auto":
        return None
    return float(parse_number(value, low=0, low_open=True, noun="SECONDS or auto"))


def shown_value(value: Any) -> str:
    """A value as an error line quotes it: terminal-safe, cut to 40 characters."""
    text = str(value)
    return printable(text[:40]) + ("..." if len(text) > 40 else "")
