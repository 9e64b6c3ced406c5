"""``ilab-journal backtest RUN...``: past runs replayed through stopping and retention
policies, touching nothing. ``ilab-journal`` finds this command through the entry point
``backtest`` of group ``ilab_journal.commands`` (pyproject.toml): journal/ never imports
the watcher, whose callbacks and built-ins a backtest runs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from journal.cli.common import UserError, dumps, user_errors
from journal.record.events import EVENTS
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.paths import JournalNotFound, resolve_journal
from journal.views.best import MetricGoal
from watcher.alerts.hang import HangRule, HangSpecError
from watcher.backtest.hangs import backtest_hangs
from watcher.backtest.hangs import table as hang_table
from watcher.backtest.outcome import table
from watcher.backtest.policies import keep_last_values, stop_policies
from watcher.backtest.replay import replay
from watcher.builtin.foreign import adapt
from watcher.hooks.callbacks import CallbackSpecError
from watcher.hooks.hook import HookOptions, HookSet, assemble_hooks, instantiate
from watcher.hooks.loading import load_object

_ON = ("evaluate", "report", "save", "log", "train_end")


def _on_event_options(fn: Any) -> Any:
    """``--on-<event> FILE.py:FUNC`` for each of :data:`_ON` (``--on <event>`` for short)."""
    for event in reversed(_ON):
        name = f"--on-{event.replace('_', '-')}"
        fn = click.option(name, multiple=True, metavar="FILE.py:FUNC", help=f"--on {event} ...")(fn)
    return fn


def _goal(text: str | None, option: str) -> str | None:
    if text is not None:
        try:
            MetricGoal.parse(text)
        except ValueError as exc:
            raise UserError(f"{option} {exc}") from None
    return text


def user_callbacks(
    callbacks: tuple[str, ...], pairs: list[tuple[str, str]]
) -> Callable[[], HookSet] | None:
    """What makes the user's callbacks' hooks for one journal (the classes loaded once,
    each made anew per journal, as each journal's watcher would); None when none."""
    if not callbacks and not pairs:
        return None
    for event, _ in pairs:
        if event not in EVENTS:
            raise CallbackSpecError(f"unknown event {event!r}; known: {', '.join(EVENTS)}")
    loaded = [(spec, load_object(spec)) for spec in callbacks]
    functions = [(event, load_object(spec)) for event, spec in pairs]

    def make() -> HookSet:
        objects = adapt([instantiate(obj, spec) for spec, obj in loaded])
        return assemble_hooks(functions, objects, [], lambda event: HookOptions())

    make()  # a callback that cannot be made: one line now, before any journal is read
    return make


def _journals(runs: tuple[str, ...]) -> list[Path]:
    """Each run's journal. A dir without one (a launch refused, a run not started: ``runs/*``
    holds such dirs) is skipped in one line, unless no run is left to judge."""
    found = []
    for run in runs:
        try:
            found.append(resolve_journal(run))
        except JournalNotFound as exc:
            if not Path(run).is_dir() or (run == runs[-1] and not found):
                raise
            click.echo(f"ilab-journal backtest: skipped {exc}", err=True)
    return found


def _hangs(journals: list[Path], hang_after: str, as_json: bool) -> None:
    """``--hang-after``: each journal's hang alarms (watcher/backtest/hangs.py)."""
    try:
        rule = HangRule.parse(hang_after)
    except HangSpecError as exc:
        raise UserError(str(exc)) from None
    hangs = [backtest_hangs(path, rule) for path in journals]
    if as_json:
        for got in hangs:
            click.echo(dumps(got.to_dict()))
    else:
        click.echo(hang_table(hangs))


@click.command()
@click.argument("runs", nargs=-1, required=True, metavar="RUN_DIR|URI...", type=RUN_DIR_OR_URI)
@click.option(
    "--early-stopping",
    multiple=True,
    metavar="SPEC",
    help="As ilab-watch's: metric=val_loss,patience=3,min_delta=0.001,mode=min. A value "
    "may be a range (patience=1..8) or a list (min_delta=[0,0.01]): one policy per value.",
)
@click.option("--divergence", multiple=True, metavar="SPEC", help="As ilab-watch's, sweeps too.")
@click.option(
    "--target",
    multiple=True,
    metavar="METRIC>=X",
    help="The eval's own stop (examples/eval_accuracy.py --target-accuracy): the first "
    "result that meets it, e.g. accuracy>=0.8 (also <=, >, <).",
)
@click.option(
    "--callback",
    "callbacks",
    multiple=True,
    metavar="MODULE:CLASS",
    help="Your callback class or object (file.py:Name), InstructLab's and training_hub's "
    "too, run as ilab-watch --callback runs it; its Controls are recorded, never sent.",
)
@click.option(
    "--on",
    "on_pairs",
    multiple=True,
    nargs=2,
    metavar="EVENT FILE.py:FUNC",
    help="A Python function hooked to an event (as watch(on_<event>=func)).",
)
@_on_event_options
@click.option(
    "--keep-last-n",
    metavar="N|A..B|[N,...]",
    help="Retention as ilab-train's (default: each run's own); a range or list sweeps.",
)
@click.option("--keep-best", metavar="METRIC:max|min", help="Default: each run's own.")
@click.option(
    "--metric",
    metavar="METRIC:max|min",
    help="What a stop's loss is judged by (default: the run's --keep-best, else the policy's).",
)
@click.option(
    "--hang-after",
    metavar="SECONDS|auto",
    help="List the hang alarms ilab-watch --hang-after (the same rule) would have raised "
    "on these runs, and how many were false (not the end of an aborted or dead attempt).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per run (JSONL).")
@user_errors
def backtest(
    runs: tuple[str, ...],
    early_stopping: tuple[str, ...],
    divergence: tuple[str, ...],
    target: tuple[str, ...],
    callbacks: tuple[str, ...],
    on_pairs: tuple[tuple[str, str], ...],
    keep_last_n: str | None,
    keep_best: str | None,
    metric: str | None,
    hang_after: str | None,
    as_json: bool,
    **on_event: tuple[str, ...],
) -> None:
    """Replay finished runs through stopping and retention policies; nothing is written.

    Per run: where each policy would have stopped it and why, the steps, samples, tokens
    and wall time that saves, the metric by then against the run's final and best, and
    which checkpoints retention keeps (and whether it deletes the one later reported
    best). Several runs, or a swept option, add one row per policy over all runs.

    With --hang-after alone, only the hang alarms: where the guard would have raised them.
    """
    journals = _journals(runs)
    if hang_after is not None:
        _hangs(journals, hang_after, as_json)
        policies_given = (early_stopping, divergence, target, callbacks, on_pairs)
        hooks_given = (*on_event.values(), keep_last_n, keep_best, metric)
        if not any(policies_given) and not any(hooks_given):
            return
    pairs = [*on_pairs, *((event, spec) for event in _ON for spec in on_event[f"on_{event}"])]
    try:
        policies = stop_policies(early_stopping, divergence, target)
        user = user_callbacks(callbacks, pairs)
        keeps = keep_last_values(keep_last_n)
    except CallbackSpecError as exc:
        raise UserError(str(exc)) from None
    best = _goal(keep_best, "--keep-best")
    judged = _goal(metric, "--metric")
    goal = MetricGoal.parse(judged) if judged else None
    results = []
    for path in journals:
        got = replay(path, policies, user, [(n, best) for n in keeps], goal)
        if as_json:
            click.echo(dumps(got.to_dict()))
        results.append(got)
    if not as_json:
        click.echo(table(results))
