"""``ilab-watch``'s guard options (``--hang-after SECONDS|auto``, ``--on-hang
report|abort``) and the guard they start beside the watcher's hooks (docs/alerts.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from journal.cli.common import Seconds
from watcher.alerts.alert import AlertSink
from watcher.alerts.guard import ON_HANG, Guard, GuardOptions
from watcher.alerts.hang import HangRule, HangSpecError


def _hang_after(_ctx: click.Context, _param: click.Parameter, value: str | None) -> HangRule | None:
    if value is None:
        return None
    try:
        return HangRule.parse(value)
    except HangSpecError as exc:
        raise click.BadParameter(str(exc).removeprefix("--hang-after ")) from None


GUARD_OPTIONS = [
    click.option(
        "--hang-after",
        "hang_after",
        metavar="SECONDS|auto",
        callback=_hang_after,
        help="Alert when the run makes no step progress for this long outside a phase the "
        "trainer declares (lease wait, save, eval, profile, first step), with every local "
        "rank's py-spy stack under RUN/alerts/<id>/; auto: 3x the 90th percentile of the "
        "attempt's last 100 step times, plus 4s. Also alerts when every process of the run "
        "is gone without a train_end (died).",
    ),
    click.option(
        "--first-step-limit",
        type=Seconds(low_open=True),
        metavar="SECONDS",
        help="With --hang-after: an attempt's first step (compile, warm-up, first "
        "collectives) longer than this is a hang [default: 10x the threshold, at least 600s].",
    ),
    click.option(
        "--on-hang",
        "on_hang",
        type=click.Choice(ON_HANG),
        default="report",
        show_default=True,
        help="abort: after the alert, SIGTERM then SIGKILL the hung attempt's ranks on this "
        "host (journaled as a hang: stop_source hang; ilab-train --max-restarts relaunches).",
    ),
]


def check_on_hang(
    hang: HangRule | None, on_hang: str, first_step: float | None, *, remote: bool, replay: bool
) -> HangRule | None:
    """The hang rule, with ``--first-step-limit``. What can never work is a usage error:
    ``--on-hang abort`` or ``--first-step-limit`` without ``--hang-after``, and a hang
    looked for in a run that is not live on this machine."""
    if hang is None and (on_hang == "abort" or first_step):
        name = "--on-hang abort" if on_hang == "abort" else "--first-step-limit"
        raise click.UsageError(f"{name} needs --hang-after SECONDS|auto")
    if hang is not None and replay:
        raise click.UsageError(
            "--hang-after watches a live run: for a past one, ilab-journal backtest RUN "
            "--hang-after SECONDS|auto lists the hangs it would have raised"
        )
    if hang is not None and remote:
        raise click.UsageError(
            "--hang-after needs the run dir on this machine (its processes and their "
            "stacks are looked at here), not a URI"
        )
    return hang if hang is None else replace(hang, first_step_s=first_step)


def start_guard(
    run_dir: Path, sink: AlertSink, options: GuardOptions, **where: Any
) -> Guard | None:
    """The one guard starter, ``ilab-watch``'s and the launcher's: a :class:`Guard` over
    ``run_dir`` (``where``: its ``start``, ``launcher_pids``, ``source``), started; None
    when ``options`` look for nothing (no hang rule, deaths not reported)."""
    if options.hang is None and not options.deaths:
        return None
    guard = Guard(run_dir, sink, options, **where)
    guard.start()
    return guard
