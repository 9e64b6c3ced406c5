"""``--notify URL``: the targets an alert is sent to, through apprise (Slack, Teams'
Workflows, Discord, e-mail, ntfy, PagerDuty, generic ``json://`` webhooks, ...), and what
each alert says.

A URL carries secrets (a Slack webhook's tokens, a mail password) and a command line is
seen by every local user (``ps``), so the URLs may come from a file (``--notify @FILE``) or
the environment (``ILAB_NOTIFY``): :func:`notify_urls`. A URL is judged at start by
apprise's own parsing (:func:`parse_targets`): one it cannot make a notifier of is one line
(:class:`BadTarget`, exit 2), which names where it came from and its scheme only. A target
is named everywhere, in the journal, on the console and in errors, by what apprise's
privacy form of it shows of its scheme and host (``json://127.0.0.1:8080``,
``slack://T...A``), and every line apprise logs is stripped of the URL's other parts before
it is shown (:func:`_redact`); apprise's log never reaches the console by itself.
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import os
import re
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import click

from watcher.alerts.alert import Alert

#: Notification type (apprise's words) per alert kind: how a chat shows it.
_SEVERITY = {
    **dict.fromkeys(("hang", "died", "failed", "diverged"), "failure"),
    **dict.fromkeys(("stopped", "condition"), "warning"),
    "completed": "success",
}


#: Where ``--notify``'s URLs come from when none is given: an environment variable, which
#: no other user can read (``ps`` shows every user's command lines).
NOTIFY_ENV = "ILAB_NOTIFY"
_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*"
#: Between two URLs of one text: whitespace (with commas), or commas before the next
#: ``scheme://`` (a comma inside a URL, as in ``mailto://...?to=a@x,b@y``, stays).
_BETWEEN_URLS = re.compile(rf"[\s,]*\s[\s,]*|,+(?={_SCHEME}://)")


class BadTarget(click.UsageError):
    """A ``--notify`` URL apprise cannot send to (one line, without its secrets)."""


def notify_urls(given: Iterable[str]) -> list[tuple[str, str]]:
    """``--notify``'s URLs, each with where it came from (``--notify #2``, ``--notify
    @urls.txt #1``, ``ILAB_NOTIFY #1``): a URL as given, a ``@FILE``'s URLs (whitespace or
    comma separated, ``#`` comment lines), and, with none given, ``ILAB_NOTIFY``'s (the
    same form; a ``@FILE`` there too). Raises :class:`BadTarget` (one line) for a file that
    cannot be read or holds no URL, and for an ``ILAB_NOTIFY`` set to nothing."""
    given, where = list(given), "--notify"
    if not given and NOTIFY_ENV in os.environ:
        given, where = _split_urls(os.environ[NOTIFY_ENV]), NOTIFY_ENV
        if not given:
            raise BadTarget(f"{NOTIFY_ENV} is set but holds no URL (unset it to notify nobody)")
    out = []
    for i, value in enumerate(given, 1):
        if not value.startswith("@"):
            out.append((f"{where} #{i}", value))
            continue
        try:  # (a byte that is no UTF-8 makes a URL apprise cannot read, said as such)
            text = Path(value[1:]).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            why = f"cannot read the file of URLs ({exc.strerror})"
            raise BadTarget(f"{where} {value}: {why}") from None
        if not (urls := _split_urls(re.sub(r"(?m)^\s*#.*$", "", text))):
            raise BadTarget(f"{where} {value}: the file holds no URL")
        out += [(f"{where} {value} #{j}", url) for j, url in enumerate(urls, 1)]
    return out


def _split_urls(text: str) -> list[str]:
    return [u.strip(",") for u in _BETWEEN_URLS.split(text) if u.strip(",")]


class _Captured(logging.Handler):
    """apprise says why a send (or a URL) failed only in its log: the lines of each call
    made under :func:`_apprise_lines`, per thread; any other line is dropped."""

    local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        if (lines := getattr(self.local, "lines", None)) is not None:
            lines.append((record.levelno, record.getMessage()))


# apprise's log never reaches the console: what it says is shown in our lines, scrubbed
_APPRISE_LOG = logging.getLogger("apprise")
_APPRISE_LOG.addHandler(_Captured(logging.DEBUG))
_APPRISE_LOG.setLevel(logging.DEBUG)
_APPRISE_LOG.propagate = False


@contextlib.contextmanager
def _apprise_lines() -> Iterator[list[tuple[int, str]]]:
    """The lines apprise logs in this thread meanwhile, as (level, message)."""
    _Captured.local.lines = lines = list[tuple[int, str]]()
    try:
        yield lines
    finally:
        _Captured.local.lines = None


@dataclass(frozen=True, eq=False)
class Target:
    """One ``--notify`` URL as apprise made it: ``name`` is what may be shown of it."""

    name: str
    plugin: Any  # apprise's notifier of the URL
    secrets: tuple[str, ...]  # parts of the URL never to show (user, password, path, query)

    def send(self, title: str, body: str, kind: str) -> str | None:
        """Send one message; None when the target took it, else why not (one line, with
        none of the URL's secrets in it). Never raises."""
        with _apprise_lines() as lines:
            try:
                severity = _SEVERITY.get(kind, "info")
                ok = bool(self.plugin.notify(body=body, title=title, notify_type=severity))
            except Exception as exc:  # a notifier's bug must not end the notifying thread
                ok = False
                lines.append((logging.ERROR, f"{type(exc).__name__}: {exc}"))
        return None if ok else _redact(_why(lines), self.secrets)


def _redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` without any of a URL's secret parts."""
    for secret in secrets:
        text = text.replace(secret, "…")
    return text


def scrub(text: str, targets: Iterable[Target]) -> str:
    """``text`` (a log's lines an alert quotes) without any secret part of the targets'
    URLs: the scrubbing every line of apprise's goes through."""
    return _redact(text, sorted({s for t in targets for s in t.secrets}, key=len, reverse=True))


def _why(lines: list[tuple[int, str]]) -> str:
    """The cause of a failed send from apprise's log: an OS error (``[Errno 111]
    Connection refused``), an HTTP status, else its last warning."""
    text = "\n".join(m for _, m in lines)
    if m := re.search(r"\[Errno -?\d+\] [^\"')\n]+", text):
        return m.group(0).strip()
    if m := re.search(r"(?:error|status)[=: ]+(\d{3})\b", text, re.IGNORECASE):
        return f"HTTP {m.group(1)}"
    warnings = [msg for level, msg in lines if level >= logging.WARNING]
    return (warnings[-1] if warnings else "the notifier said no").splitlines()[0][:300]


def parse_targets(urls: Iterable[str | tuple[str, str]]) -> list[Target]:
    """Every ``--notify`` URL (or ``(where, URL)``, as :func:`notify_urls` gives them) as a
    :class:`Target`; the first apprise cannot send to raises :class:`BadTarget`, naming where
    it came from and its scheme only (a URL may hold a token)."""
    urls = list(urls)
    if not urls:
        return []
    try:
        import apprise  # here: only a watcher that notifies pays for its import
    except ImportError:
        raise BadTarget(
            "--notify needs apprise, which is not installed: pip install 'ilab-journal[alerts]'"
        ) from None

    out = []
    for i, item in enumerate(urls, 1):
        where, url = item if isinstance(item, tuple) else (f"--notify #{i}", item)
        scheme = url.partition("://")[0] if "://" in url else ""
        shown = f"{where} ({scheme}://...)" if scheme else where
        if not scheme or not re.fullmatch(_SCHEME, scheme):
            raise BadTarget(
                f"{shown}: not a URL (apprise's form is scheme://..., e.g. json://host/)"
            )
        if scheme.lower() not in _notifiers():
            raise BadTarget(f"{shown}: {_no_notifier(scheme.lower(), apprise.__version__)}")
        with _apprise_lines() as lines:
            plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
        if plugin is None:  # apprise's first line says what is wrong; no secret of the URL
            said = next((m for level, m in lines if level >= logging.WARNING and m), "?")
            said = _redact(said.splitlines()[0][:300], _secrets(url, ""))
            raise BadTarget(f"{shown}: apprise cannot read this {scheme} URL: {said}")
        if isinstance(port := getattr(plugin, "port", None), int) and not 0 < port < 65536:
            raise BadTarget(f"{shown}: port {port} is out of range (1 to 65535)")
        out.append(Target(_name(plugin, scheme), plugin, _secrets(url, _private(plugin))))
    return out


def _notifiers() -> dict[str, str]:
    """Every scheme apprise has a notifier for (its plugin manager's), with its service's
    name (``workflows``: ``Power Automate / Workflows (for MSTeams)``)."""
    from apprise.manager_plugins import NotificationManager

    manager = NotificationManager()
    return {str(s).lower(): str(manager[s].service_name) for s in manager.schemas()}


def _no_notifier(scheme: str, version: str) -> str:
    """Why a scheme is refused: the installed apprise has no notifier of it; the schemes
    likely meant (a service whose name says it: ``msteams`` -> ``workflows``; a close
    spelling) are only ones it has."""
    known = _notifiers()
    says = [s for s, name in sorted(known.items()) if scheme in re.sub(r"\W", "", name.lower())]
    meant = (says if len(scheme) > 3 else [])[:3] or difflib.get_close_matches(scheme, known, n=3)
    hint = f"; did you mean {' or '.join(f'{s}://' for s in meant)}?" if meant else ""
    return f"apprise {version} has no {scheme}:// notifier{hint} (`apprise --details` lists them)"


def _name(plugin: Any, scheme: str) -> str:
    """``scheme://host[:port]`` from apprise's privacy form of the URL (a host that is a
    token, as a Slack URL's, comes masked: ``T...A``)."""
    netloc = urlsplit(_private(plugin)).netloc.rpartition("@")[2]
    return f"{scheme.lower()}://{netloc}"


def _private(plugin: Any) -> str:
    """apprise's form of the URL with its secrets masked ('' when it has none)."""
    try:
        return str(plugin.url(privacy=True))
    except Exception:  # a notifier's bug: nothing of the URL is shown then
        return ""


def _secrets(url: str, private: str) -> tuple[str, ...]:
    """The parts of a URL that may be secret: user, password, host, each path segment and
    query value (3 characters or more), raw and unquoted, longest first; less those the
    privacy form shows as they are (an address, a topic), which are no secret."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return (url,)
    user, _, host = parts.netloc.rpartition("@")
    found = [*user.split(":", 1), host.rpartition(":")[0] or host, *parts.path.split("/")]
    found += [*re.split(r"[&=]", parts.query), parts.fragment]
    found += [unquote(f) for f in found]
    shown = set(re.split(r"[/:@?&=#]", private))
    out = {f for f in found if len(f) >= 3 and f not in shown}
    return tuple(sorted(out, key=len, reverse=True))


def compose(alert: Alert, *, run_label: str, run_id: str | None) -> tuple[str, str]:
    """The title and body of an alert's message: the run (its dir or URI, its run id, the
    host), the kind, the step, what was seen, and where the evidence is."""
    step = f"step {alert.step}" if alert.step is not None else "step unknown"
    title = f"[ilab] {alert.kind}: {run_label} at {step}"
    attempt = f", attempt {alert.attempt}" if alert.attempt is not None else ""
    evidence = ", ".join(f"{run_label.rstrip('/')}/{p}" for p in alert.evidence)
    lines = [
        f"run: {run_label} (run id {run_id or 'unknown'}{attempt}, host {socket.gethostname()})",
        f"alert: {alert.kind} at {step}" + (f" ({alert.condition})" if alert.condition else ""),
        f"seen: {alert.message}",
        f"evidence: {evidence or 'none captured'}",
        *(f"not captured: {m}" for m in alert.missing),
        f"alert id: {alert.id}; more: ilab-journal status {run_label}",
    ]
    return title, "\n".join(lines)


def names(targets: Sequence[Target]) -> list[str]:
    return [t.name for t in targets]
