"""InstructLab's training API on this trainer: ``run_training(torch_args, train_args)``.

For people who fine-tune with InstructLab's training library (PyPI ``instructlab-training``,
0.16.2): the same call, in its argument order, with its field names. It takes that
package's own ``TorchrunArgs``/``TrainingArgs`` objects where it is installed (this project
does not depend on it), or plain mappings (a YAML file: :func:`load_config`) with the same
field names. Every field is mapped by the table in :mod:`trainer.instructlab.fields`; a
field training here cannot honour is one :class:`InstructLabConfigError` naming it, never
silently dropped. The run itself is :func:`trainer.launch.run_training`'s: same journal,
watcher, control channel and result. docs/instructlab.md lists every field.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from trainer.config import ConfigError, TorchrunArgs, TrainingArgs
from trainer.config.file import load_config_file
from trainer.instructlab.fields import FIXED, REQUIRED, TRAIN_RULES, Refused
from trainer.launch import TrainingResult
from trainer.launch import run_training as _run_training

#: instructlab-training 0.16.2 ``TorchrunArgs`` fields (all supported, same meaning).
TORCH_FIELDS = (
    "nproc_per_node",
    "nnodes",
    "node_rank",
    "rdzv_id",
    "rdzv_endpoint",
    "master_addr",
    "master_port",
)
#: torchrun's own default port, which InstructLab relies on when only master_addr is given.
TORCHRUN_DEFAULT_PORT = 29500
#: Our field -> the InstructLab field that sets it (to name the user's field in errors).
_THEIRS = {o: name for name, rule in reversed(TRAIN_RULES.items()) for o in rule.ours}


class InstructLabConfigError(ConfigError):
    """InstructLab settings that cannot run here; one line naming every field at fault."""


def run_training(
    torch_args: Any,
    train_args: Any,
    *,
    echo: bool = True,
    env: dict[str, str] | None = None,
    **overrides: Any,
) -> TrainingResult:
    """InstructLab's ``run_training(torch_args, train_args)``, run by this trainer.

    Args:
        torch_args: instructlab-training's ``TorchrunArgs`` or a mapping of its fields.
        train_args: instructlab-training's ``TrainingArgs`` or a mapping of its fields.
        echo, env: as for :func:`trainer.launch.run_training`.
        overrides: fields of our :class:`~trainer.config.TrainingArgs` set on top of the
            mapped ones, e.g. ``on_save=fn``, ``callbacks=[...]``, ``max_steps=100``.

    Returns our :class:`~trainer.launch.TrainingResult`. Raises
    :class:`InstructLabConfigError` (naming the fields) before anything starts when a field
    is unknown, missing or refused, and otherwise what :func:`trainer.launch.run_training`
    raises.
    """
    ours, trun = to_ours(torch_args, train_args, **overrides)
    return _run_training(ours, trun, echo=echo, env=env)


def to_ours(
    torch_args: Any, train_args: Any, **overrides: Any
) -> tuple[TrainingArgs, TorchrunArgs]:
    """Our ``(TrainingArgs, TorchrunArgs)`` for InstructLab's pair (see :func:`run_training`)."""
    ours = map_train_args(as_fields(train_args, "train_args"), overrides)
    return ours, map_torch_args(as_fields(torch_args, "torch_args"))


def load_config(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(torch_args, train_args)`` from a YAML (or JSON) file holding those two mappings
    (``torch_args`` may be left out: one process on one node)."""
    try:
        data = load_config_file(path)
    except ValueError as exc:
        raise InstructLabConfigError(str(exc)) from None
    unknown = sorted(set(data) - {"torch_args", "train_args"})
    if unknown:
        raise InstructLabConfigError(
            f"{path}: unknown section(s) {unknown}: expected torch_args and train_args"
        )
    if not isinstance(data.get("train_args"), dict):
        raise InstructLabConfigError(f"{path}: needs a train_args mapping")
    torch_args = data.get("torch_args") or {}
    if not isinstance(torch_args, dict):
        raise InstructLabConfigError(f"{path}: torch_args must be a mapping")
    return torch_args, data["train_args"]


def from_config(path: Path, **overrides: Any) -> tuple[TrainingArgs, TorchrunArgs]:
    """Our settings for an InstructLab YAML file (``ilab-train --instructlab-config``)."""
    torch_args, train_args = load_config(path)
    return to_ours(torch_args, train_args, **overrides)


def as_fields(obj: Any, what: str) -> dict[str, Any]:
    """The fields of an instructlab-training object or a mapping, as plain values (enums
    as their values, nested objects as mappings)."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, BaseModel):  # instructlab-training's own TrainingArgs/TorchrunArgs
        fields = obj.model_dump(mode="json")
        if hasattr(obj, "callbacks"):  # excluded from its dump: never dropped silently
            fields["callbacks"] = obj.callbacks
        return fields
    kind = "TorchrunArgs" if what == "torch_args" else "TrainingArgs"
    raise InstructLabConfigError(
        f"{what} must be a mapping or instructlab-training's {kind}, not {type(obj).__name__}"
    )


def _plain(value: Any) -> Any:
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def map_train_args(given: dict[str, Any], overrides: Mapping[str, Any]) -> TrainingArgs:
    """Our TrainingArgs for InstructLab ``train_args`` fields (absent ones take InstructLab's
    defaults), then ``overrides``; every problem in one :class:`InstructLabConfigError`."""
    errors = [
        f"train_args.{name}: unknown field (not in instructlab-training 0.16.2's TrainingArgs)"
        for name in given
        if name not in TRAIN_RULES
    ]
    values = {name: given.get(name, rule.default) for name, rule in TRAIN_RULES.items()}
    errors += [f"train_args.{n}: required" for n, v in values.items() if v is REQUIRED]
    if errors:
        raise InstructLabConfigError("; ".join(errors))
    ours: dict[str, Any] = dict(FIXED)
    for name, rule in TRAIN_RULES.items():
        try:
            ours.update(rule.to_ours(values[name], values))
        except Refused as exc:
            where = f"{name}.{exc.sub}" if exc.sub else name
            errors.append(f"train_args.{where}: {exc}")
        except (TypeError, ValueError, AttributeError) as exc:  # a value of the wrong shape
            errors.append(f"train_args.{name}: invalid value {values[name]!r} ({exc})")
    if errors:
        raise InstructLabConfigError("; ".join(errors))
    merged = {**ours, **overrides}
    if ours.get("callbacks") and overrides.get("callbacks"):  # theirs, then ours
        merged["callbacks"] = [*ours["callbacks"], *overrides["callbacks"]]
    try:
        return TrainingArgs.model_validate(merged)
    except ValidationError as exc:
        raise InstructLabConfigError(_describe(exc, overrides)) from None


def _describe(exc: ValidationError, overrides: Mapping[str, Any]) -> str:
    """Pydantic's errors, naming the user's fields (InstructLab's names, or the override)."""
    out = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        loc = [str(x) for x in e["loc"]]
        if not loc:
            out.append(msg)
        elif loc[0] in overrides:
            out.append(f"{'.'.join(loc)} (override): {msg}")
        else:
            out.append(f"train_args.{'.'.join([_THEIRS.get(loc[0], loc[0]), *loc[1:]])}: {msg}")
    return "; ".join(out)


def map_torch_args(given: dict[str, Any]) -> TorchrunArgs:
    """Our TorchrunArgs for InstructLab ``torch_args`` (absent fields: one node, one rank)."""
    unknown = [n for n in given if n not in TORCH_FIELDS]
    if unknown:
        raise InstructLabConfigError(
            "; ".join(
                f"torch_args.{n}: unknown field (not in instructlab-training 0.16.2's TorchrunArgs)"
                for n in unknown
            )
        )
    fields = {k: v for k, v in given.items() if v is not None}
    if fields.get("nproc_per_node") == "gpu":
        fields["nproc_per_node"] = _gpu_count()
    if "rdzv_id" in fields:
        fields["rdzv_id"] = str(fields["rdzv_id"])
    if fields.get("master_addr") and not fields.get("master_port"):
        fields["master_port"] = TORCHRUN_DEFAULT_PORT
    try:
        return TorchrunArgs.model_validate(fields)
    except ValidationError as exc:
        raise InstructLabConfigError("; ".join(map(_torch_error, exc.errors()))) from None


def _torch_error(e: Any) -> str:
    msg = e["msg"].removeprefix("Value error, ")
    loc = ".".join(map(str, e["loc"]))
    return f"torch_args.{loc}: {msg}" if loc else f"torch_args: {msg}"


def _gpu_count() -> int:
    import torch  # only for nproc_per_node: gpu

    n = torch.cuda.device_count()
    if n == 0:
        raise InstructLabConfigError("torch_args.nproc_per_node: 'gpu' but this node has no GPU")
    return n
