"""``ilab-train``'s options, generated from the fields of the pydantic models.

Every field of :class:`TrainingArgs` (its nested :class:`ModelConfig` included) and of
:class:`TorchrunArgs` is one option: the flag is the field's name with dashes, ``Literal``
becomes ``click.Choice``, ``bool`` a flag, the field's description is the help and click
shows the field's default. What differs from that rule is in :data:`OVERRIDES`; the fields no flag sets are in
:data:`CONFIG_ONLY`, each with its reason. A value reaches the model only when its flag was
given on the command line, so a ``--config`` file's value stands unless a flag overrides it.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import click
from click.core import ParameterSource
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from trainer.config import TorchrunArgs, TrainingArgs

#: The models the options come from, by the key a --config file holds them under ("" is
#: the top level). A nested model field (TrainingArgs.model) is walked into the same way.
MODELS: dict[str, type[BaseModel]] = {"": TrainingArgs, "torchrun": TorchrunArgs}


@dataclass(frozen=True)
class Override:
    """How one field's option differs from the generated one."""

    flag: str | None = None
    type: click.ParamType | None = None
    metavar: str | None = None
    multiple: bool = False  # given once per value (a value may hold commas)


#: Field path -> what its option does differently: a shorter flag, or a stricter click type
#: (checked by click, before pydantic sees the value).
OVERRIDES: dict[str, Override] = {
    "ckpt_dir": Override(type=click.Path(file_okay=False, path_type=Path)),
    "data_path": Override("--data", click.Path(dir_okay=False, path_type=Path)),
    "val_data_path": Override("--val-data", click.Path(dir_okay=False, path_type=Path)),
    "model_path": Override(type=click.Path(exists=True, path_type=Path)),
    "effective_batch_size": Override("--batch-size"),
    "keep_best": Override(metavar="METRIC:max|min"),
    "profile_steps": Override(metavar="A:B"),
    "export_every": Override(type=click.IntRange(min=1)),
    "pg_timeout_s": Override("--pg-timeout", click.FloatRange(min=0, min_open=True)),
    "hang_after": Override(metavar="SECONDS|auto"),
    "hang_action": Override("--on-hang"),  # as ilab-watch's (an on_<event> name is a hook's)
    "notify": Override(type=click.STRING, metavar="URL|@FILE", multiple=True),
    "notify_when": Override(type=click.STRING, metavar="EXPR", multiple=True),
    "notify_on": Override(metavar="KIND,..."),
}

#: Field paths no flag sets (a --config file or the Python API does), and why. Callback
#: fields (excluded from the workers' copy) are never flags: they hold Python callables.
CONFIG_ONLY: dict[str, str] = {
    "callback_grace_s": "bounds the wait for on_<event> callbacks, which no flag sets",
    "model.max_seq_len": "--max-seq-len sets it (one setting for the built-in model)",
    "tracker_settings": "a mapping of the trackers' options (InstructLab's tracker fields)",
}

#: Help sections: the top-level field that opens each, in the models' declaration order.
SECTIONS: dict[str, str] = {
    "ckpt_dir": "Run and data",
    "model": "Model",
    "num_epochs": "Optimization",
    "log_every": "Logging and checkpoints",
    "mixed_precision": "Precision, scale and speed",
    "hang_after": "Hangs, restarts and alerts",
    "torchrun": "Launch (torchrun)",
}


class SectionedOption(click.Option):
    """A click option that knows the help section it is listed under."""

    def __init__(self, *args: Any, section: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.section = section


class SectionedCommand(click.Command):
    """A command whose ``--help`` lists its options in sections (options without one first,
    under "Options"): click has no option groups of its own."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {"Options": []}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None and isinstance(param, click.Option):
                name = getattr(param, "section", None) or "Options"
                sections.setdefault(name, []).append(record)
        for name, records in sections.items():
            if records:
                with formatter.section(name):
                    formatter.write_dl(records)


@dataclass(frozen=True)
class FieldOption:
    """One generated option: the field it sets, its flag and click's arguments for it."""

    path: str  # "lr", "model.d_model", "torchrun.nnodes"
    flag: str
    decls: tuple[str, ...]
    attrs: dict[str, Any]

    @property
    def name(self) -> str:
        """The option's parameter name (a Python identifier)."""
        return self.decls[-1]


def model_fields(prefix: str, model: type[BaseModel]) -> Iterator[tuple[str, FieldInfo]]:
    """``(path, field)`` for every plain-data leaf field of ``model``, nested ones walked."""
    for name, info in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, BaseModel):
            yield from model_fields(path, sub)
        elif not info.exclude:  # callback fields: the workers' copy excludes them
            yield path, info


class CommaList(click.ParamType):
    """A list setting as one comma-separated value (``--report-to tensorboard,mlflow``,
    ``--lora-target-modules q_proj,v_proj``); with ``choices`` each item must be one of them."""

    name = "list"

    def __init__(self, choices: list[str] | None = None) -> None:
        self.choices = choices

    def get_metavar(self, param: click.Parameter, *args: Any, **kwargs: Any) -> str:
        return ",".join(self.choices) if self.choices else "NAME,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, list):  # a default, or a value already converted
            return value
        items = [item.strip() for item in str(value).split(",")]
        if not all(items):
            self.fail(f"{value!r} is not a comma-separated list of names", param, ctx)
        bad = [item for item in items if self.choices and item not in self.choices]
        if bad:
            self.fail(f"{bad[0]!r} is not one of {', '.join(self.choices or [])}", param, ctx)
        return items


def _click_type(annotation: Any) -> tuple[Any, bool]:
    """The click type of a field's annotation (``X | None`` is X) and whether it is a flag."""
    if get_origin(annotation) in (Union, types.UnionType):
        [annotation] = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        return click.Choice([str(a) for a in get_args(annotation)]), False
    if annotation is bool:
        return None, True
    if annotation is Path:
        return click.Path(path_type=Path), False
    if annotation in (int, float, str):
        return annotation, False
    if get_origin(annotation) is list:
        [item] = get_args(annotation)
        if get_origin(item) is Literal:
            return CommaList([str(a) for a in get_args(item)]), False
        if item is str:
            return CommaList(), False
    if get_origin(annotation) is tuple and all(a in (int, float) for a in get_args(annotation)):
        return click.Tuple(list(get_args(annotation))), False  # --adam-betas 0.9 0.95
    raise TypeError(f"no click type for {annotation!r}: add an Override or CONFIG_ONLY entry")


def _option(path: str, info: FieldInfo, section: str | None) -> FieldOption:
    over = OVERRIDES.get(path, Override())
    flag = over.flag or "--" + path.rsplit(".", 1)[-1].replace("_", "-")
    ptype, is_flag = (over.type, False) if over.type else _click_type(info.annotation)
    default = None if info.is_required() else info.get_default(call_default_factory=True)
    if default == []:  # an empty list: nothing to show
        default = None
    # a flag that is on unless switched off: --x/--no-x
    decl = f"{flag}/--no-{flag[2:]}" if is_flag and default else flag
    attrs = {
        "type": ptype,
        "is_flag": is_flag,
        "default": default,
        "show_default": True,
        "metavar": over.metavar,
        "multiple": over.multiple,
        "help": info.description,
        "section": section,
    }
    return FieldOption(path, flag, (decl, path.replace(".", "__")), attrs)


def field_options() -> list[FieldOption]:
    """The generated options, in the models' declaration order."""
    out: list[FieldOption] = []
    section: str | None = None
    for prefix, model in MODELS.items():
        for path, info in model_fields(prefix, model):
            section = SECTIONS.get(path.split(".")[0], section)
            if path not in CONFIG_ONLY:
                out.append(_option(path, info, section))
    return out


FIELD_OPTIONS = field_options()
#: Field path -> its flag, for naming the flag in a validation error.
FLAG_OF = {fo.path: fo.flag for fo in FIELD_OPTIONS}


def add_field_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: every generated option, on a click command function."""
    for fo in reversed(FIELD_OPTIONS):
        func = click.option(*fo.decls, cls=SectionedOption, **fo.attrs)(func)
    return func


def setting_name(path: str, flags: set[str] | None, source: str = "--config") -> str:
    """How an error names the setting at ``path``: by its flag when the value came from the
    command line (``flags``: the paths given as flags; None: no file, so all of them),
    else as the file ``source`` spells it, with the flag that overrides it."""
    head, _, item = path.rpartition(".")
    if item.isdigit() and head in FLAG_OF:  # adam_betas.0: an item of --adam-betas
        path = head
    flag = FLAG_OF.get(path)
    if flag and (flags is None or path in flags):
        return flag
    return f"{path} in {source}" + (f" ({flag})" if flag else "")


def apply_given(ctx: click.Context, values: dict[str, Any], base: dict[str, Any]) -> set[str]:
    """Set each option given on the command line into the --config mapping ``base``,
    nested by its field path (``model.d_model`` -> ``base["model"]["d_model"]``); returns
    the paths set."""
    given: set[str] = set()
    for fo in FIELD_OPTIONS:
        if ctx.get_parameter_source(fo.name) in (None, ParameterSource.DEFAULT):
            continue
        given.add(fo.path)
        *parents, leaf = fo.path.split(".")
        target = base
        for key in parents:
            if target.get(key) is None:  # absent, or `model:` left empty in a YAML file
                target[key] = {}
            target = target[key]
            if not isinstance(target, dict):
                raise click.UsageError(f"{key!r} in --config must be a mapping")
        target[leaf] = values[fo.name]
    return given
