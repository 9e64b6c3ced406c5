"""What every ``ilab-journal`` command shares: user errors as one line, JSON output, scans."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import orjson

from journal.record.numbers import parse_number, shown_value
from journal.record.record import Record
from journal.rundir.paths import JournalNotFound

if TYPE_CHECKING:
    from journal.read.reader import InvalidLine

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


@contextmanager
def as_user_error(*errors: type[Exception]) -> Iterator[None]:
    """Any of ``errors`` raised inside as a :class:`UserError` with its message."""
    try:
        yield
    except errors as exc:
        raise UserError(str(exc)) from None


class Number(click.ParamType):
    """A finite number from ``low`` (``low_open``: more than it) to ``high``, whole when
    ``whole``: :func:`parse_number` as a click type.

    click's ``FloatRange`` lets ``nan`` through every bound (a comparison with nan is
    false) and ``inf`` through a lower one. Out of range is one line naming the option
    (:class:`UserError`, exit 2), not click's usage banner."""

    name = "number"

    def __init__(
        self,
        low: float | None = None,
        high: float | None = None,
        *,
        low_open: bool = False,
        whole: bool = False,
        noun: str | None = None,
    ) -> None:
        self.low, self.high, self.low_open = low, high, low_open
        self.whole, self.noun = whole, noun
        if whole:
            self.name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        name = max(param.opts, key=len) if param is not None and param.opts else self.name
        try:
            return parse_number(
                value,
                whole=self.whole,
                low=self.low,
                high=self.high,
                low_open=self.low_open,
                noun=self.noun,
            )
        except ValueError as exc:
            raise UserError(f"{name} {shown_value(value)}: {exc}") from None


class Seconds(Number):
    """A number of seconds from ``low`` (``low_open``: more than it) to ``high``, finite:
    ``--stale-after nan`` made a dead run never stale, ``--lease-ttl nan`` left checkpoints
    unleased."""

    name = "seconds"

    def __init__(self, low: float = 0.0, high: float | None = None, *, low_open: bool = False):
        super().__init__(low, high, low_open=low_open, noun="a finite number of seconds")


#: ``--stale-after`` of status, check and serve: when a run that stopped writing counts as stale.
stale_after_option = click.option(
    "--stale-after",
    type=Seconds(),
    default=600.0,
    show_default=True,
    help="Seconds without a record (and no train_end) after which a run counts as stale.",
)


def dumps(obj: Any) -> str:
    """Compact JSON (anything unknown as ``str``)."""
    return orjson.dumps(obj, default=str).decode()


def scan(path: Path) -> Iterator[tuple[list[Record], list[InvalidLine]]]:
    from journal.read.reader import iter_batches  # the reader only for the commands that scan

    for batch in iter_batches(path, final=True):
        yield batch.records, batch.invalid


def require_journal(path: Path, valid: int, invalid: int) -> None:
    """A non-empty file with no valid record is not a journal: say so."""
    if valid == 0 and invalid > 0:
        raise UserError(f"{path}: not a journal ({invalid} lines, none a valid record)")
