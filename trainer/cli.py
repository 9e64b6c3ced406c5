"""``ilab-train``: command-line front end of ``run_training``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from pydantic import ValidationError

from trainer.config import ConfigError, TorchrunArgs, TrainingArgs
from trainer.config.cli_options import (
    SectionedCommand,
    add_field_options,
    apply_given,
    setting_name,
)
from trainer.config.file import load_config_file
from trainer.data.rows import DataError

EXIT_CODES = {"completed": 0, "stopped": 0, "failed": 1, "interrupted": 5}


def _errors(
    exc: ValidationError, prefix: str = "", flags: set[str] | None = None, source: str = ""
) -> str:
    """One line naming each bad setting as the user gave it: its flag, or its key in the
    file ``source`` (``flags``: the paths given as flags; ``prefix``: where the model sits
    in a --config file, "torchrun." for TorchrunArgs)."""
    lines = []
    for e in exc.errors():
        msg = e["msg"].removeprefix("Value error, ")
        path = prefix + ".".join(str(x) for x in e["loc"])
        if not e["loc"]:  # a check across fields: its message names them
            lines.append(msg)
        elif e["type"] == "extra_forbidden":  # only a config file can carry unknown keys
            lines.append(f"unknown setting {path!r} in --config")
        else:
            lines.append(f"{setting_name(path, flags, source or '--config')}: {msg}")
    return "; ".join(lines)


@click.command(
    cls=SectionedCommand,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.option(
    "--config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="JSON or YAML file of TrainingArgs fields (plus an optional 'torchrun' mapping); flags override it.",
)
@click.option(
    "--instructlab-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="YAML (or JSON) of InstructLab's run_training settings: torch_args and train_args "
    "mappings with instructlab-training's field names (docs/instructlab.md); flags override it.",
)
@click.option("--quiet", is_flag=True, help="Do not echo worker output (it still goes to logs/).")
@add_field_options
def main(config: Path | None, instructlab_config: Path | None, quiet: bool, **opts: Any) -> None:
    """Train with FSDP under torchrun, journaling every lifecycle event.

    \b
    Example (the built-in demo on 2 CPU ranks):
      ilab-train --demo --ckpt-dir runs/demo --max-steps 40 --nproc-per-node 2

    Watch it from another shell with `ilab-journal tail -f runs/demo` or react to it with
    `ilab-watch runs/demo --on-save eval.py`.

    Exit codes: 0 completed or stopped, 1 failed, 2 bad options, 3 the checkpoint dir is in
    use by another launch (the message names it), 4 relaunched no more for want of
    progress (--max-no-progress-attempts), 5 interrupted, 130 Ctrl-C twice.
    """
    from trainer.launch import RunDirBusy, TrainingFailed, run_training
    from trainer.launch.cluster_env import cluster_torchrun
    from trainer.launch.interrupts import StoppedNow
    from trainer.launch.result import NoProgress

    # the exit code of each error: the first class that matches (see the docstring)
    exits = {ConfigError: 2, DataError: 2, RunDirBusy: 3, NoProgress: 4, TrainingFailed: 1}
    base: dict[str, Any] = {}
    if instructlab_config is not None:
        base = _instructlab_base(instructlab_config, config)
    elif config is not None:
        try:
            base = load_config_file(config)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    flags = apply_given(click.get_current_context(), opts, base)
    source = "--config" if config else "--instructlab-config" if instructlab_config else ""
    given = flags if source else None  # no file: every setting came from a flag
    torchrun_base = base.pop("torchrun", None) or {}
    if isinstance(torchrun_base, dict):  # in a pod or a Slurm job: nodes and rendezvous from
        try:  # PET_*, PyTorchJob's or SLURM_* variables (trainer/launch/cluster_env.py)
            torchrun_base = cluster_torchrun(torchrun_base)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from None
    if "ckpt_dir" not in base:
        raise click.UsageError("--ckpt-dir is required (or ckpt_dir in --config)")
    try:
        targs = TrainingArgs.model_validate({**base, "model": base.get("model") or {}})
    except ValidationError as exc:
        raise click.UsageError(_errors(exc, flags=given, source=source)) from None
    try:
        trun = TorchrunArgs.model_validate(torchrun_base)
    except ValidationError as exc:
        raise click.UsageError(_errors(exc, "torchrun.", given, source)) from None
    try:
        result = run_training(targs, trun, echo=not quiet)
    except (ConfigError, DataError, RunDirBusy, TrainingFailed) as exc:  # one line, no usage
        click.echo(f"ilab-train: {exc}", err=True)  # banner: the options were parsed
        sys.exit(next(code for kind, code in exits.items() if isinstance(exc, kind)))
    except OSError as exc:  # e.g. a full disk before the workers started
        click.echo(f"ilab-train: {exc.strerror or exc}: {exc.filename or targs.ckpt_dir}", err=True)
        sys.exit(1)
    except StoppedNow:  # Ctrl-C twice: said in one line when it came
        sys.exit(130)
    except KeyboardInterrupt:  # before the workers started, or while ending: no traceback
        click.echo("ilab-train: interrupted", err=True)
        sys.exit(130)
    click.echo(
        f"ilab-train: {result.status}"
        + (f" ({result.reason})" if result.reason else "")
        + f"; journal {result.journal_path}"
        + (f"; checkpoint {result.final_checkpoint}" if result.final_checkpoint else ""),
        err=True,
    )
    sys.exit(EXIT_CODES.get(result.status, 1))


def _instructlab_base(path: Path, config: Path | None) -> dict[str, Any]:
    """``--instructlab-config``: the mapped settings as a ``--config`` mapping (flags still
    override them); a field that cannot run here is one line naming it (exit 2)."""
    from trainer.instructlab import from_config

    if config is not None:
        raise click.UsageError("give --config or --instructlab-config, not both")
    try:
        targs, trun = from_config(path)
    except ConfigError as exc:
        click.echo(f"ilab-train: {exc}", err=True)
        sys.exit(2)
    return {**targs.data_dict(), "torchrun": trun.model_dump(exclude_none=True)}


if __name__ == "__main__":
    main()
