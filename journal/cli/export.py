"""``ilab-journal export``: the consolidated model of a saved checkpoint, made later.

The conversion reads tensors, so it runs in a child process of the same interpreter (this
package never imports torch), whose one-line errors and exit code pass through unchanged.
Which module converts is not named here: the package that can (the trainer) declares it as
the entry point :data:`EXPORTER` of group :data:`EXPORT_GROUP` (pyproject.toml), so the
contract depends on no trainer module, not even by a string.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import entry_points

import click

from journal.cli.common import UserError, user_errors
from journal.rundir.paths import resolve_journal

#: The entry point group and name of the exporter: a ``module:function`` whose module runs
#: with ``python -m`` and takes ``CKPT_DIR [--step N] [--force]``.
EXPORT_GROUP = "ilab_journal.export"
EXPORTER = "hf"


def exporter_module() -> str:
    """The module that converts a checkpoint, from the installed entry point. Raises
    :class:`UserError` (one line, exit 2) when none is installed."""
    found = entry_points(group=EXPORT_GROUP, name=EXPORTER)
    if not found:
        raise UserError(
            f"no exporter is installed (entry point {EXPORT_GROUP}:{EXPORTER}, declared by "
            "the trainer): reinstall ilab-journal (in a checkout: pip install -e .)"
        )
    return next(iter(found)).module


@click.command()
@click.argument("dir", type=click.Path())
@click.option(
    "--step",
    type=click.IntRange(min=0),
    help="The checkpoint's step (default: the newest complete checkpoint).",
)
@click.option("--force", is_flag=True, help="Write it again where the checkpoint has one.")
@user_errors
def export(dir: str, step: int | None, force: bool) -> None:
    """Write a checkpoint's consolidated model (its hf/ dir) from its sharded state.

    For checkpoints saved without one: runs with --export-every N, or a save made while
    the run was interrupted. The model loads with from_pretrained (or
    trainer.model.builtin.load_consolidated for the built-in model) like any export. It prints the
    hf/ path; a checkpoint that already has one is left alone unless --force. The
    checkpoint is leased while it is converted, so a running trainer keeps it.
    """
    ckpt_dir = resolve_journal(dir).parent
    argv = [sys.executable, "-m", exporter_module(), str(ckpt_dir)]
    argv += [*(["--step", str(step)] if step is not None else []), *(["--force"] if force else [])]
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        raise UserError(f"cannot run the export: {exc}") from None
    if code:
        sys.exit(code)
