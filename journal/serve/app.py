"""The web app of ``ilab-journal serve`` (starlette): the page, its static files and ``/api/``.

Read-only unless started with ``--allow-control``; then ``POST /api/runs/<key>/control``
writes a control command through :func:`journal.channels.control.send_command`, with the
source ``web:<remote address>``, only for a request that carries the token printed at start
(``X-Ilab-Token``), is JSON, and comes from the page's own origin. Requests naming another
host than the one served (a DNS-rebinding page) are refused too.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from journal.channels.control import CommandRefused, InvalidCommand, send_command
from journal.serve import data
from journal.serve.fold import RunFold
from journal.serve.marks import style_table
from journal.serve.runs import Run, RunSet

STATIC = Path(__file__).parent / "static"
#: Commands the page's buttons send (stop, save, evaluate; abort stays a CLI decision).
WEB_COMMANDS = ("stop", "save", "evaluate")
MAX_WIDTH = 4000
#: Defence in depth behind text-only rendering: no inline or foreign script can run.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class ServeConfig:
    """What the server was started with."""

    runs: RunSet
    allow_control: bool = False
    token: str | None = None
    loopback: bool = True  # bound to a loopback address: other Host names are refused


def _json(obj: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(obj), status_code=status, media_type="application/json")


def _error(status: int, message: str) -> Response:
    return _json({"error": message}, status)


def _int(request: Request, name: str, default: int) -> int:
    try:
        return int(request.query_params.get(name, default))
    except ValueError:
        return default


def _float(request: Request, name: str) -> float | None:
    try:
        v = request.query_params.get(name)
        return None if v in (None, "") else float(v)
    except ValueError:
        return None


def _width(request: Request) -> int:
    return max(10, min(MAX_WIDTH, _int(request, "width", data.DEFAULT_WIDTH)))


def is_loopback(host: str) -> bool:
    """Whether a host name or address is this machine's loopback: ``localhost`` or a
    loopback IP (v4 or v6, without brackets). The one check of both the address ``serve``
    listens on (``--host``) and the ``Host`` header a request names."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_ok(request: Request, cfg: ServeConfig) -> bool:
    """On a loopback address, only loopback host names: a page from elsewhere that points
    its own name at 127.0.0.1 (DNS rebinding) cannot read the runs."""
    if not cfg.loopback:
        return True
    return is_loopback(request.headers.get("host", "").rsplit(":", 1)[0].strip("[]"))


def build_app(cfg: ServeConfig) -> Starlette:
    """The app serving ``cfg.runs``."""
    runs = cfg.runs

    def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers=_HEADERS)

    def api_config(request: Request) -> Response:
        return _json(
            {"control": cfg.allow_control, "commands": list(WEB_COMMANDS), "marks": style_table()}
        )

    def api_runs(request: Request) -> Response:
        return _json({"runs": runs.rows()})

    def with_fold(handler: Callable[[Request, Run, RunFold], Response]) -> Callable[..., Response]:
        """A run's route: ``handler`` given the run and its fold read on, or the answer
        saying why there is none (one line)."""

        def answer(request: Request) -> Response:
            run = runs.get(request.path_params["key"])
            if run is None:
                return _error(404, "no such run")
            fold = run.opened()
            return _error(500, fold.unreadable) if fold.unreadable else handler(request, run, fold)

        return answer

    def api_run(request: Request, run: Run, fold: RunFold) -> Response:
        body = data.snapshot(fold, width=_width(request), stale_after=runs.stale_after)
        body.update(key=run.key, source=run.source, remote=run.remote)
        return _json(body)

    def api_updates(request: Request, run: Run, fold: RunFold) -> Response:
        lengths = [int(n) for n in request.query_params.get("n", "").split(",") if n.isdigit()]
        body = data.updates(
            fold,
            since=_int(request, "since", 0),
            lengths=lengths,
            markers=_int(request, "m", 0),
            width=_width(request),
            stale_after=runs.stale_after,
            leases=request.query_params.get("leases"),
        )
        return _json(body)

    def api_series(request: Request, run: Run, fold: RunFold) -> Response:
        name = request.query_params.get("name", "")
        lo, hi = _float(request, "lo"), _float(request, "hi")
        out = data.series_range(fold, name, lo, hi, _width(request))
        return _json(out) if out is not None else _error(404, "no such curve")

    async def api_control(request: Request) -> Response:
        refused = _control_refused(request, cfg)
        if refused is not None:
            return refused
        run = runs.get(request.path_params["key"])
        if run is None:
            return _error(404, "no such run")
        if run.remote:
            return _error(409, "a mirrored run: send commands with ilab-journal control URI")
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError:
            return _error(400, "the body is not JSON")
        command = body.get("command") if isinstance(body, dict) else None
        reason = body.get("reason") if isinstance(body, dict) else None
        if command not in WEB_COMMANDS:
            return _error(400, f"command must be one of {', '.join(WEB_COMMANDS)}")
        if reason is not None and not isinstance(reason, str):
            return _error(400, "reason must be text")
        client = request.client.host if request.client else "unknown"
        try:
            cid = send_command(run.dir, command, reason=reason or None, source=f"web:{client}")
        except InvalidCommand as exc:
            return _error(400, str(exc))
        except CommandRefused as exc:  # ended (journaled as rejected) or died
            return _error(409, str(exc))
        except OSError as exc:  # e.g. a journal.jsonl that is a directory
            return _error(409, f"cannot send a command to this run: {exc.strerror or exc}")
        return _json({"id": cid, "command": command, "source": f"web:{client}"})

    routes = [
        Route("/", page),
        Route("/run/{key}", page),
        Route("/compare", page),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
        Route("/api/config", api_config),
        Route("/api/runs", api_runs),
        Route("/api/runs/{key}", with_fold(api_run)),
        Route("/api/runs/{key}/updates", with_fold(api_updates)),
        Route("/api/runs/{key}/series", with_fold(api_series)),
        Route("/api/runs/{key}/control", api_control, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]

    async def guard(request: Request, call_next: Any) -> Response:
        if not _host_ok(request, cfg):
            return _error(403, "unknown Host: open the address the server printed")
        response: Response = await call_next(request)
        for k, v in _HEADERS.items():
            response.headers.setdefault(k, v)
        return response

    return Starlette(routes=routes, middleware=[Middleware(BaseHTTPMiddleware, dispatch=guard)])


def _control_refused(request: Request, cfg: ServeConfig) -> Response | None:
    """Why a control request is refused (403/415), or None: the flag, the token, the origin."""
    if not cfg.allow_control or not cfg.token:
        return _error(403, "read-only: start ilab-journal serve with --allow-control")
    given = request.headers.get("x-ilab-token", "")
    if not hmac.compare_digest(given.encode(), cfg.token.encode()):
        return _error(403, "missing or wrong token: open the address the server printed")
    origin = request.headers.get("origin")
    own = f"{request.url.scheme}://{request.headers.get('host', '')}"
    if origin is not None and origin != own:
        return _error(403, "cross-origin request refused")
    if request.headers.get("sec-fetch-site") in ("cross-site", "same-site"):
        return _error(403, "cross-origin request refused")
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return _error(415, "send the command as application/json")
    return None
