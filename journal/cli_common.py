"""What every ``ilab-journal`` command shares: user errors as one line, JSON output, scans."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

import click
import orjson

from journal.paths import JournalNotFound
from journal.reader import InvalidLine, iter_batches

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
