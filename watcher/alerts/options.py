"""``ilab-watch``'s notification options (``--notify URL``, ``--notify-when EXPR``,
``--notify-on KINDS``) and what they start: the run's :class:`AlertDispatcher` and the
:class:`AlertRules` the watcher delivers records to. Everything that can be judged at start
is, one line each (exit 2): a URL apprise cannot send to, an expression ``check`` would
refuse, a kind that is none."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from watcher.alerts.rules import DEFAULT_KINDS, NOTIFY_KINDS, AlertRules
from watcher.alerts.sink import AlertDispatcher

NOTIFY_OPTIONS = [
    click.option(
        "--notify",
        "notify",
        multiple=True,
        metavar="URL|@FILE",
        help="Tell URL of each alert (repeatable): an apprise URL, e.g. json://host:port/path, "
        "slack://..., workflows://... (Teams), discord://..., mailto://..., ntfy://..., "
        "pagerduty://...; @FILE: the URLs in FILE; none given: those in $ILAB_NOTIFY. A URL "
        "holds secrets and every local user sees a command line (ps): prefer @FILE or "
        "$ILAB_NOTIFY. Alerts (journaled as alert records, shown by ilab-journal status): the run failed, "
        "diverged (NaN/Inf loss or --divergence's rule), was stopped, hung or died "
        "(--hang-after), a --notify-when condition holds; once per condition per attempt. "
        "Docs: docs/alerts.md.",
    ),
    click.option(
        "--notify-when",
        "notify_when",
        multiple=True,
        metavar="EXPR",
        help="Alert once per attempt when EXPR holds, in ilab-journal check's grammar, e.g. "
        "'best(accuracy) >= 0.9' or 'steps >= 1000' (repeatable).",
    ),
    click.option(
        "--notify-on",
        "notify_on",
        metavar="KINDS",
        help="Which alerts are raised: a comma-separated list of "
        f"{', '.join(NOTIFY_KINDS)}, or all [default: every kind but completed].",
    ),
]


def parse_kinds(text: str | None) -> frozenset[str]:
    """``--notify-on``'s kinds (None: the default); an unknown one is a usage error."""
    if text is None:
        return DEFAULT_KINDS
    words = [w.strip() for w in text.split(",") if w.strip()]
    if words == ["all"]:
        return frozenset(NOTIFY_KINDS)
    bad = [w for w in words if w not in NOTIFY_KINDS]
    if bad or not words:
        raise click.UsageError(
            f"--notify-on {text!r}: {', '.join(map(repr, bad)) or 'no kind'} is not one of "
            f"{', '.join(NOTIFY_KINDS)}, all"
        )
    return frozenset(words)


@dataclass
class Alerting:
    """A watcher's alerts: the sink every detector hands its alerts to, and the journal's
    rules (a callback object for the watcher's hooks)."""

    sink: AlertDispatcher
    rules: AlertRules

    def close(self, timeout: float = 10.0) -> None:
        """Tell the targets what is pending (at most ``timeout`` seconds), then stop."""
        self.sink.close(timeout)


def open_alerts(
    run_dir: Path,
    run_label: str,
    *,
    notify: Sequence[str] = (),
    notify_when: Sequence[str] = (),
    notify_on: str | None = None,
    divergence: str | None = None,
    source: str = "ilab-watch",
    always: bool = False,
) -> Alerting | None:
    """The alerts the options ask for (None: none of them given, and not ``always``: a
    watcher with other detectors passes it to have a sink anyway). Raises
    ``click.UsageError`` (one line) for what can never work (a bad target: ``BadTarget``)."""
    from journal.ask.expect import ExpectError, parse
    from watcher.alerts.notify import notify_urls
    from watcher.builtin.steering import DivergenceDetector, parse_builtin
    from watcher.hooks.callbacks import CallbackSpecError

    urls = notify_urls(notify)  # @FILE read; none given: $ILAB_NOTIFY's
    if not (urls or notify_when or notify_on is not None or always):
        return None
    kinds = parse_kinds(notify_on)
    try:
        conditions = [parse(text) for text in notify_when]
    except ExpectError as exc:
        raise click.UsageError(f"--notify-when {exc}") from None
    detector: Any = None
    if divergence is not None:
        try:  # the steering detector's own settings: the alert and the stop agree
            detector = parse_builtin("divergence", divergence)
        except CallbackSpecError as exc:
            raise click.UsageError(str(exc)) from None
    told = kinds | {"condition"}  # the guard's kinds left out are journaled, not told
    sink = AlertDispatcher(run_dir, targets=urls, run_label=run_label, source=source, kinds=told)
    rules = AlertRules(
        sink,
        conditions=conditions,
        kinds=kinds,
        divergence=detector if isinstance(detector, DivergenceDetector) else None,
        run_dir=run_dir,
    )
    return Alerting(sink, rules)
