"""``--notify URL``: the targets an alert is sent to, through apprise (Slack, Teams, Discord,
e-mail, ntfy, PagerDuty, generic ``json://`` webhooks, ...), and what each alert says.

A URL is judged at start by apprise's own parsing (:func:`parse_targets`): one it cannot
make a notifier of is one line (:class:`BadTarget`, exit 2), which names its scheme only. A
URL carries secrets (a Slack webhook's tokens, a mail password), so a target is named
everywhere, in the journal, on the console and in errors, by what apprise's privacy form of
it shows of its scheme and host (``json://127.0.0.1:8080``, ``slack://T...A``), and an
error is stripped of the URL's other parts (:meth:`Target.send`).
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from watcher.alerts.alert import Alert

#: Notification type (apprise's words) per alert kind: how a chat shows it.
_SEVERITY = {
    "hang": "failure",
    "died": "failure",
    "failed": "failure",
    "diverged": "failure",
    "stopped": "warning",
    "condition": "warning",
    "completed": "success",
}


class BadTarget(ValueError):
    """A ``--notify`` URL apprise cannot send to (one line, without its secrets)."""


class _Captured(logging.Handler):
    """apprise says why a send failed only in its log: each send's lines, per thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.local = threading.local()

    def emit(self, record: logging.LogRecord) -> None:
        lines = getattr(self.local, "lines", None)
        if lines is not None:
            lines.append((record.levelno, record.getMessage()))


_CAPTURE: _Captured | None = None
_CAPTURE_LOCK = threading.Lock()


def _capture() -> _Captured:
    """apprise's log, taken off the console (our line says the same, without secrets)."""
    global _CAPTURE
    with _CAPTURE_LOCK:
        if _CAPTURE is None:
            _CAPTURE = _Captured()
            logger = logging.getLogger("apprise")
            logger.addHandler(_CAPTURE)
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
        return _CAPTURE


@dataclass(frozen=True, eq=False)
class Target:
    """One ``--notify`` URL as apprise made it: ``name`` is what may be shown of it."""

    name: str
    plugin: Any  # apprise's notifier of the URL
    secrets: tuple[str, ...]  # parts of the URL never to show (user, password, path, query)

    def send(self, title: str, body: str, kind: str) -> str | None:
        """Send one message; None when the target took it, else why not (one line, with
        none of the URL's secrets in it). Never raises."""
        cap = _capture()
        lines: list[tuple[int, str]] = []
        cap.local.lines = lines
        try:
            ok = bool(
                self.plugin.notify(body=body, title=title, notify_type=_SEVERITY.get(kind, "info"))
            )
        except Exception as exc:  # a notifier's bug must not end the notifying thread
            ok, lines = False, [*lines, (logging.ERROR, f"{type(exc).__name__}: {exc}")]
        finally:
            cap.local.lines = None
        return None if ok else self.redact(_why(lines))

    def redact(self, text: str) -> str:
        """``text`` without any of the URL's secret parts."""
        for secret in self.secrets:
            text = text.replace(secret, "…")
        return text


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


def parse_targets(urls: Iterable[str]) -> list[Target]:
    """Every ``--notify`` URL as a :class:`Target`; the first apprise cannot send to raises
    :class:`BadTarget`, naming its position and scheme only (a URL may hold a token)."""
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
    for i, url in enumerate(urls, 1):
        scheme = url.partition("://")[0] if "://" in url else ""
        shown = f"--notify #{i} ({scheme}://...)" if scheme else f"--notify #{i}"
        if not scheme or not re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
            raise BadTarget(
                f"{shown}: not a URL (apprise's form is scheme://..., e.g. json://host/)"
            )
        if scheme.lower() not in _schemes(apprise):
            raise BadTarget(
                f"{shown}: apprise knows no {scheme!r} notifier (its URLs: slack://, "
                "msteams://, discord://, mailto://, ntfy://, pagerduty://, json://, ...)"
            )
        plugin = apprise.Apprise.instantiate(url, suppress_exceptions=True)
        if plugin is None:
            raise BadTarget(f"{shown}: apprise cannot read this {scheme} URL (see its URL form)")
        if isinstance(port := getattr(plugin, "port", None), int) and not 0 < port < 65536:
            raise BadTarget(f"{shown}: port {port} is out of range (1 to 65535)")
        out.append(Target(_name(plugin, scheme), plugin, _secrets(url, _private(plugin))))
    return out


def _schemes(apprise: Any) -> set[str]:
    """Every scheme apprise has a notifier for (its plugin manager's list)."""
    from apprise.manager_plugins import NotificationManager

    return {str(s).lower() for s in NotificationManager().schemas()}


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
    lines = [
        f"run: {run_label} (run id {run_id or 'unknown'}{attempt}, host {socket.gethostname()})",
        f"alert: {alert.kind} at {step}" + (f" ({alert.condition})" if alert.condition else ""),
        f"seen: {alert.message}",
    ]
    lines.append(
        "evidence: " + ", ".join(_under(run_label, p) for p in alert.evidence)
        if alert.evidence
        else "evidence: none captured"
    )
    lines += [f"not captured: {m}" for m in alert.missing]
    lines.append(f"alert id: {alert.id}; more: ilab-journal status {run_label}")
    return title, "\n".join(lines)


def _under(run_label: str, path: str) -> str:
    return f"{run_label.rstrip('/')}/{path}"


def names(targets: Sequence[Target]) -> list[str]:
    return [t.name for t in targets]
