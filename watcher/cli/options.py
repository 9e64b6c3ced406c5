"""The options of ``ilab-watch`` (its command line, apart from what ``main`` does with
it): one decorator, :func:`watch_options`, so that a feature's options live beside it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click

from journal.checkpoints.leases import DEFAULT_TTL_S, MAX_TTL_S
from journal.cli.common import Seconds
from journal.record.events import EVENTS
from watcher.alerts.guard_options import GUARD_OPTIONS
from watcher.alerts.options import NOTIFY_OPTIONS
from watcher.hooks.hook import QueuePolicy
from watcher.lmeval.options import LM_EVAL_OPTIONS
from watcher.mirror.options import MIRROR_OPTIONS
from watcher.mirror.remote import RunDirOrURI
from watcher.scheduler.options import SCHEDULER_OPTIONS

_SHOWN_EVENTS = ("save", "evaluate", "report", "train_end")
#: A cursor name: it names files (``<name>.cursor.json``, ...) and is printed on consoles,
#: so no separator, control character, bidi mark or leading dot.
_CURSOR_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")


def _cursor_name(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _CURSOR_NAME.fullmatch(value):
        raise click.BadParameter(
            f"{value!a}: one word of up to 100 letters, digits and . _ - (it names files)"
        )
    return value


def event_options(fn: Any) -> Any:
    for event in reversed(EVENTS):
        fn = click.option(
            f"--on-{event.replace('_', '-')}",
            f"on_{event}",
            multiple=True,
            metavar="CMD",
            help=f"Run CMD on each {event} record." if event in _SHOWN_EVENTS else None,
            hidden=event not in (*_SHOWN_EVENTS, "log"),
        )(fn)
    return fn


def parse_queue(values: tuple[str, ...]) -> dict[str | None, QueuePolicy]:
    out: dict[str | None, QueuePolicy] = {}
    for v in values:
        event, _, policy = v.rpartition("=")
        if policy not in ("all", "latest"):
            raise click.UsageError(f"--queue {v!r}: policy must be 'all' or 'latest'")
        if event and event not in EVENTS:
            raise click.UsageError(f"--queue {v!r}: unknown event {event!r}")
        out[event or None] = "all" if policy == "all" else "latest"
    return out


_OPTIONS = [
    click.argument("dir", type=RunDirOrURI()),  # a URI: a mirrored run (watcher/mirror)
    click.option(
        "--on",
        "on_pairs",
        type=(str, str),
        multiple=True,
        metavar="EVENT CMD",
        help="Run CMD on EVENT records (any event; repeatable).",
    ),
    click.option(
        "--callback",
        "callbacks",
        multiple=True,
        metavar="MODULE:OBJ",
        help="A class or object with on_<event> methods (module path or file.py:Name).",
    ),
    click.option(
        "--early-stopping",
        "early_stopping",
        metavar="K=V,...",
        help="Built-in EarlyStopping, e.g. metric=val_loss,patience=3,min_delta=0.01,mode=min.",
    ),
    click.option(
        "--divergence",
        metavar="K=V,...",
        help="Built-in DivergenceDetector, e.g. threshold=1.0,patience=3,warmup=10,action=abort "
        "(NaN/Inf loss triggers at once).",
    ),
    click.option(
        "--tensorboard",
        "tensorboard_dir",
        type=click.Path(file_okay=False, path_type=Path),
        metavar="LOGDIR",
        help="Write loss, lr, grad_norm, throughput, val_* and reported metrics as TensorBoard "
        "scalars (and save/control/train_end as text) to LOGDIR/<run dir name>-<run id> (one "
        "TensorBoard run per journal run), live or with --replay; restarts add no duplicate "
        "points, another LOGDIR is another cursor. Needs the tensorboard package.",
    ),
    click.option(
        "--mlflow",
        "mlflow_uri",
        is_flag=False,
        flag_value="",
        metavar="[TRACKING_URI]",
        help="Write params, metrics, checkpoint paths and the run status to MLflow (one run per "
        "journal run; default URI: $MLFLOW_TRACKING_URI); restarts add no duplicate points. "
        "Needs the mlflow package.",
    ),
    click.option(
        "--mlflow-log-artifacts",
        is_flag=True,
        help="With --mlflow: also copy each checkpoint into the run's artifacts (default: its path).",
    ),
    click.option(
        "--wandb",
        "wandb",
        is_flag=True,
        help="Write config, metrics and the run status to Weights & Biases (offline unless "
        "WANDB_MODE=online; run dirs in DIR/wandb, for `wandb sync`). Needs the wandb package.",
    ),
    click.option(
        "--name",
        callback=_cursor_name,
        help="Cursor identity: one word of letters, digits and . _ - (default: derived from "
        "the hooks). It names the cursor's files in the state dir.",
    ),
    click.option(
        "--state-dir",
        type=click.Path(file_okay=False, path_type=Path),
        help="Cursor, results file and delivery logs (default: DIR/watch).",
    ),
    click.option(
        "--from",
        "start",
        type=click.Choice(["start", "now"]),
        default="start",
        show_default=True,
        help="Where to begin when no cursor exists yet (an existing cursor always wins; "
        "use a new --name for a fresh pass).",
    ),
    click.option(
        "--replay", is_flag=True, help="Deliver the journal as it is, then exit (no following)."
    ),
    click.option(
        "--timeout",
        type=Seconds(low_open=True),
        help="Seconds per delivery before its process group is killed [default: 3600].",
    ),
    click.option(
        "--retries",
        type=click.IntRange(min=0),
        default=0,
        show_default=True,
        help="Extra attempts after a failure, with backoff.",
    ),
    click.option(
        "--backoff",
        type=Seconds(),
        default=1.0,
        show_default=True,
        help="First retry delay in seconds (doubles).",
    ),
    click.option(
        "--concurrency",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Deliveries of one command hook that may run at once (a --callback object's "
        "methods run one at a time, in journal order).",
    ),
    click.option(
        "--queue",
        "queue",
        multiple=True,
        metavar="[EVENT=]all|latest",
        help="all: every record is delivered; latest: only the newest pending one "
        "(default for high-rate events such as log and step_end).",
    ),
    click.option(
        "--shell", is_flag=True, help="Run CMD through /bin/sh (placeholders are shell-quoted)."
    ),
    click.option(
        "--poll",
        type=Seconds(low_open=True),
        metavar="SECONDS",
        help="Poll instead of filesystem events (automatic on network filesystems).",
    ),
    click.option(
        "--lease-ttl",
        type=Seconds(1, MAX_TTL_S),  # inf and nan refused: a lease must end
        default=DEFAULT_TTL_S,
        show_default=True,
        metavar="SECONDS",
        help="A save's checkpoint is leased (kept from rotation) while its delivery is queued "
        "or running; the lease is renewed every third of this and expires this long after the "
        "watcher dies.",
    ),
    click.option("--quiet", "-q", is_flag=True, help="Only print failures."),
    click.option(
        "--verbose",
        "-v",
        count=True,
        help="Also print each delivery's stdout (-vv: also where the watcher is in the journal).",
    ),
]


def watch_options(fn: Any) -> Any:
    """Every ``ilab-watch`` option (in ``--help`` order) on ``fn``."""
    every = [*_OPTIONS, *LM_EVAL_OPTIONS, *SCHEDULER_OPTIONS, *NOTIFY_OPTIONS, *GUARD_OPTIONS]
    for option in reversed(every + MIRROR_OPTIONS):
        fn = option(fn)
    return event_options(fn)  # applied last: the --on-<event> options come first
