"""What every ``ilab-journal`` command shares: user errors as one line, JSON output, scans."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from journal.read.reader import InvalidLine, iter_batches
from journal.record.text import printable
from journal.rundir.paths import JournalNotFound

F = TypeVar("F", bound=Callable[..., Any])


class UserError(click.ClickException):
    """One clear line on stderr and exit 2, never a traceback."""

    exit_code = 2


def user_errors(fn: F) -> F:
    """Turn expected problems with the user's paths into :class:`UserError`."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except JournalNotFound as exc:
            raise UserError(str(exc)) from None
        except (IsADirectoryError, NotADirectoryError, PermissionError, FileNotFoundError) as exc:
            raise UserError(f"{exc.filename}: {exc.strerror}") from None

    return wrapper  # type: ignore[return-value]


class Seconds(click.ParamType):
    """A number of seconds from ``low`` (``low_open``: more than it) to ``high``, finite.

    click's ``FloatRange`` lets ``nan`` through every bound (a comparison with nan is
    false) and ``inf`` through a lower one: ``--stale-after nan`` made a dead run never
    stale, ``--lease-ttl nan`` left checkpoints unleased. Out of range is one line naming
    the option (:class:`UserError`, exit 2), not click's usage banner."""

    name = "seconds"

    def __init__(self, low: float = 0.0, high: float | None = None, *, low_open: bool = False):
        self.low, self.high, self.low_open = low, high, low_open

    def _range(self) -> str:
        if self.low_open:
            low = f"more than {self.low:.15g}"
            return low if self.high is None else f"{low} and at most {self.high:.15g}"
        return (
            f"{self.low:.15g} or more"
            if self.high is None
            else f"{self.low:.15g} to {self.high:.15g}"
        )

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        name = max(param.opts, key=len) if param is not None and param.opts else "seconds"
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = math.nan
        if not (
            math.isfinite(number)
            and (number > self.low if self.low_open else number >= self.low)
            and (self.high is None or number <= self.high)
        ):
            shown = printable(str(value)[:40])
            raise UserError(f"{name} {shown}: expected a finite number of seconds, {self._range()}")
        return number


def dumps(obj: Any) -> str:
    """Compact JSON (anything unknown as ``str``)."""
    return orjson.dumps(obj, default=str).decode()


def scan(path: Path) -> Iterator[tuple[list[dict[str, Any]], list[InvalidLine]]]:
    for batch in iter_batches(path, final=True):
        yield batch.records, batch.invalid


def require_journal(path: Path, valid: int, invalid: int) -> None:
    """A non-empty file with no valid record is not a journal: say so."""
    if valid == 0 and invalid > 0:
        raise UserError(f"{path}: not a journal ({invalid} lines, none a valid record)")
