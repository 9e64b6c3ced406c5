"""``ilab-journal serve``: a live web page of one or many runs (docs/serve.md)."""

from __future__ import annotations

import secrets
import socket
import sys
from pathlib import Path

import click

from journal.cli.common import UserError, stale_after_option, user_errors
from journal.remote.readers import RUN_DIR_OR_URI
from journal.remote.store import is_uri

DEFAULT_PORT = 8420


def _sources(given: tuple[str, ...]) -> list[tuple[str, Path, bool]]:
    """Each SOURCE as (as given, local dir, remote); a store URI becomes its kept-in-step
    copy. A path that does not exist yet is kept: its run is waited for."""
    out = []
    for text in given or (".",):
        remote = is_uri(text)
        local = RUN_DIR_OR_URI.convert(text, None, None) if remote else text
        out.append((text, Path(local), remote))
    return out


@click.command()
@click.argument("sources", nargs=-1, metavar="[RUN_DIR | PARENT_DIR | URI]...")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. Anything but loopback shows the runs to the network.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port to listen on (0: any free port; the address is printed).",
)
@click.option(
    "--allow-control",
    is_flag=True,
    help="Show stop / save / evaluate buttons. Each request must carry the token "
    "printed at start; commands are journaled with the source web:<address>.",
)
@stale_after_option
@user_errors
def serve(
    sources: tuple[str, ...], host: str, port: int, allow_control: bool, stale_after: float
) -> None:
    """Serve a live page of runs: curves with every save, eval, report, command and attempt
    marked, a checkpoints table, and the same data as JSON under /api/.

    \b
    SOURCES (default: the current dir), any number of:
      RUN_DIR      a run's checkpoint dir (or its journal.jsonl)
      PARENT_DIR   a dir of run dirs: the runs list, newest first (new runs appear)
      URI          a mirrored run (s3://bucket/prefix), read from the store
    A dir with no run yet (or not there yet) is waited for, as tail -f does: its run
    appears on the page when it starts. Read-only unless --allow-control. Needs the
    'serve' extra.
    """
    try:
        import uvicorn

        from journal.serve.app import ServeConfig, build_app, is_loopback
        from journal.serve.runs import RunSet
    except ImportError:
        raise UserError("serve needs its extra: pip install 'ilab-journal[serve]'") from None
    runs = RunSet(_sources(sources), stale_after=stale_after)
    found = runs.refresh()
    named = {p.parent if p.is_file() else p for _, p, _ in runs.sources}
    for run in found:
        if run.remote or run.dir in named:
            run.opened()  # a run named by itself: folded now, so its page opens at once
    loopback = is_loopback(host)
    token = secrets.token_urlsafe(24) if allow_control else None
    app = build_app(ServeConfig(runs, allow_control, token, loopback))
    try:
        sock = socket.create_server(
            (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
        )
    except OSError as exc:
        # (socket.create_server adds "(while attempting to bind on address ...)": said already)
        why = (exc.strerror or str(exc)).split(" (while attempting")[0]
        raise UserError(f"cannot listen on {host}:{port}: {why} (try --port 0)") from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    if not loopback:
        click.echo(
            f"warning: listening on {host}: anyone who can reach it sees these runs", err=True
        )
    mode = "control allowed with the token in this address" if token else "read-only"
    click.echo(f"serving {len(found)} run(s) at {url}  ({mode}; Ctrl-C stops)")
    sys.stdout.flush()
    if not found:  # as tail -f and ilab-watch: a run not started yet is waited for
        click.echo(
            f"waiting for a run in {', '.join(sources or ('.',))} (no journal.jsonl yet): "
            "the page lists it when it starts",
            err=True,
        )
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
