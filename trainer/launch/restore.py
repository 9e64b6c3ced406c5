"""``--restore-from URI``: a launch into a run dir that holds no journal first brings back
the run mirrored at URI (``ilab-watch DIR --mirror URI``): its journal and its newest
checkpoint with the completion marker. The launch then resumes it as any other: the attempt
goes up, ``seq`` continues, the step is the checkpoint's."""

from __future__ import annotations

from pathlib import Path

from journal.remote.restore import RestoreError, restore_run
from journal.remote.store import StoreURIError, check_uri
from journal.rundir.paths import journal_path
from trainer.config import ConfigError, TrainingArgs
from trainer.launch.console import say


def check_restore_uri(args: TrainingArgs) -> None:
    """Refuse a URI with a credential in it before anything is written (ConfigError)."""
    if args.restore_from is not None:
        try:
            check_uri(args.restore_from)
        except StoreURIError as exc:
            raise ConfigError(f"--restore-from: {exc}") from None
        if args.resume == "never":
            raise ConfigError("--restore-from continues a run: not together with --resume never")


def restore_if_empty(args: TrainingArgs, ckpt_dir: Path) -> None:
    """Restore into ``ckpt_dir`` when asked and it holds no journal (one that does is
    resumed from itself: its own records are newer than the mirror's)."""
    uri = args.restore_from
    if uri is None:
        return
    if journal_path(ckpt_dir).exists():
        say(
            f"{ckpt_dir} holds a journal: resuming from it (--restore-from is for an empty run dir)"
        )
        return
    try:
        got = restore_run(uri, ckpt_dir)
    except (RestoreError, StoreURIError) as exc:
        raise ConfigError(f"--restore-from: {exc}") from None
    what = f"{got.checkpoint} (step {got.step})" if got.checkpoint else "no checkpoint"
    say(
        f"restored {what} and the journal ({got.journal_bytes} bytes) from {uri} in "
        f"{got.seconds:.1f}s"
    )
