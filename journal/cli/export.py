"""``ilab-journal export``: the consolidated model of a saved checkpoint, made later.

The conversion reads tensors, so it runs in ``python -m trainer.checkpoint.export`` (this package never
imports torch): a child process of the same interpreter, whose one-line errors and exit
code pass through unchanged.
"""

from __future__ import annotations

import subprocess
import sys

import click

from journal.cli.common import UserError, user_errors
from journal.rundir.paths import resolve_journal


@click.command()
@click.argument("dir", type=click.Path())
@click.option(
    "--step",
    type=click.IntRange(min=0),
    default=None,
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
    argv = [sys.executable, "-m", "trainer.checkpoint.export", str(ckpt_dir)]
    argv += [*(["--step", str(step)] if step is not None else []), *(["--force"] if force else [])]
    try:
        code = subprocess.call(argv)
    except OSError as exc:
        raise UserError(f"cannot run the export: {exc}") from None
    if code:
        sys.exit(code)
