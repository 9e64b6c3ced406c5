"""What every settings model of :mod:`trainer.config` shares: values the workers cannot take
are refused when the settings are made, in the launcher, as one line naming the field.

- Floats must be finite: ``inf``/``nan`` pass ``gt=0`` checks (``inf > 0``) and then reach
  the workers as JSON ``null`` (``learning_rate: Infinity`` failed in every rank).
- A whole-number field takes no float and no float-looking string: pydantic would turn
  ``1e12`` from a JSON file into an int silently, and YAML reads ``1e12`` as a string.
- A seed is what every seeded generator here and in InstructLab takes (:data:`Seed`).
- A whole number fits in 64 bits (:data:`INT_LIMIT`): the workers journal every setting in
  ``train_begin`` and orjson holds no larger one (``warmup_steps: 10**20`` failed in every
  worker 43 s after the launch, naming no setting).
"""

from __future__ import annotations

import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin
from urllib.parse import urlsplit

from pydantic import AfterValidator, BaseModel, ConfigDict, ValidationInfo, field_validator

from journal.record.numbers import seconds_or_auto

#: Seeds are 0 <= seed < 2**32: torch takes up to 2**64 - 1, but the data order seeds its
#: generator with ``seed * 1000 + epoch`` and NumPy (InstructLab's seeding) takes 32 bits.
SEED_LIMIT = 2**32


def _seed(value: int) -> int:
    if not 0 <= value < SEED_LIMIT:
        raise ValueError(
            f"must be a whole number from 0 to {SEED_LIMIT - 1} (2**32 - 1), got {value}"
        )
    return value


Seed = Annotated[int, AfterValidator(_seed)]


#: The largest whole number a setting may be: what the journal (orjson) and torch's int64
#: hold. Any step count, interval or size a run can reach is far below it.
INT_LIMIT = 2**63 - 1


def _is_int(annotation: Any) -> bool:
    """Whether a field holds a whole number (``int`` or ``int | None``)."""
    if get_origin(annotation) in (Union, types.UnionType):
        return int in get_args(annotation)
    return annotation is int


def whole_number(value: Any) -> Any:
    """``value`` unchanged, unless it is a float (or a string of one) for an int field."""
    if isinstance(value, str):
        try:
            int(value)
            return value  # "64": pydantic's own int parsing
        except ValueError:
            try:
                number = float(value)
            except ValueError:
                return value  # not a number at all: pydantic's own message
        what = f"the string {value!r}"
    elif isinstance(value, float):
        number, what = value, f"the float {value!r}"
    else:
        return value
    hint = f" (write {int(number)})" if number.is_integer() else ""
    raise ValueError(f"expected a whole number, got {what}{hint}")


class Settings(BaseModel):
    """Base of the settings models: unknown keys, non-finite floats and floats for whole
    numbers are refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _whole_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        return whole_number(value) if field and _is_int(field.annotation) else value

    @field_validator("*", mode="after")
    @classmethod
    def _in_64_bits(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT_LIMIT:
            raise ValueError(
                f"must be at most {INT_LIMIT} (2**63 - 1, the largest whole number the journal "
                f"and the workers hold), got {value}"
            )
        return value


def data_file_problem(path: Path, what: str) -> str | None:
    """Why ``path`` cannot be read as a data file (``what``: "training data file"), or None."""
    if path.is_dir():
        return f"{what} {path} is a directory, not a data file"
    if not path.is_file():
        return f"{what} {path} does not exist"
    return None


def parse_profile_steps(spec: str) -> tuple[int, int]:
    """``"A:B"`` (steps A to B, both included) or ``"N"`` (step N alone) -> ``(A, B)``.

    Raises ValueError (one line, naming the expected form) for anything else."""
    parts = spec.split(":")
    try:
        if len(parts) not in (1, 2):
            raise ValueError
        first, last = int(parts[0]), int(parts[-1])
    except ValueError:
        raise ValueError(f"expected A:B or N (steps, e.g. 5:7), got {spec!r}") from None
    if first < 1 or last < first:
        raise ValueError(f"expected steps 1 <= A <= B, got {spec!r}")
    return first, last


def checked_by(parse: Callable[[str], object]) -> AfterValidator:
    """The check of an optional text setting: ``parse`` raises ValueError (one line, naming
    the expected form) for a bad value; the value is kept as given."""

    def check(value: str | None) -> str | None:
        if value is not None:
            parse(value)
        return value

    return AfterValidator(check)


def parse_hang_after(spec: str) -> str:
    """``hang_after``: ``"auto"`` or a positive number of seconds, as given (normalized:
    ``"auto"`` lower-case); ValueError naming the form otherwise (the one rule,
    :func:`journal.record.numbers.seconds_or_auto`). Parsed once, here: the launcher's
    guard reads the number back with ``float``."""
    return "auto" if seconds_or_auto(spec) is None else spec.strip()


#: ``TrainingArgs.hang_after``: seconds or ``auto``, checked where the settings are made.
HangAfter = Annotated[
    str | None, AfterValidator(lambda v: parse_hang_after(v) if v is not None else None)
]


#: ``TrainingArgs.tracker_settings`` keys (the exporters' options, watcher/exporters/registry.py).
TRACKER_SETTINGS = (
    "tensorboard_dir",
    "mlflow_tracking_uri",
    "mlflow_experiment",
    "mlflow_run_name",
    "wandb_project",
    "wandb_entity",
    "wandb_run_name",
)


def _known_trackers(v: dict[str, str]) -> dict[str, str]:
    if unknown := sorted(set(v) - set(TRACKER_SETTINGS)):
        raise ValueError(f"unknown {unknown}; known: {', '.join(TRACKER_SETTINGS)}")
    # the settings are journaled (train_begin's config) and become MLflow params
    if "@" in urlsplit(v.get("mlflow_tracking_uri", "")).netloc:
        raise ValueError(
            "refusing an mlflow_tracking_uri with credentials in it (it would be journaled): "
            "give them as MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
        )
    return v


#: Where ``report_to``'s trackers write, by :data:`TRACKER_SETTINGS` key.
TrackerSettings = Annotated[dict[str, str], AfterValidator(_known_trackers)]
