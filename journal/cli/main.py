"""``ilab-journal``: read and steer a training run from its journal, for people and scripts.

This module holds the group and ``status``, the command scripts and cron call most (its
start is measured: benchmarks/bench_startup.py). Every other command lives in the module of
its kind and is imported when named (:class:`~journal.cli.plugins.PluginGroup`): reading
(journal/cli/read.py: show, tail, query), whole-journal scans (journal/cli/scan.py: stats,
validate, schema, plot), writing (journal/cli/write.py), check, serve and export. Heavy
imports (pydantic, rich, matplotlib) happen inside the commands that need them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from journal.cli.common import dumps, require_journal, stale_after_option, user_errors
from journal.cli.format import holder_text, status_text
from journal.cli.plugins import PluginGroup
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.files import json_files
from journal.rundir.lock import run_holder
from journal.rundir.paths import control_dir, resolve_journal

if TYPE_CHECKING:
    from journal.views.summary import RunSummary


@click.group(
    cls=PluginGroup,
    lazy_commands={
        "check": "journal.cli.check:check",
        "control": "journal.cli.write:control",
        "export": "journal.cli.export:export",
        "lease": "journal.cli.write:lease",
        "plot": "journal.cli.scan:plot",
        "prune": "journal.cli.write:prune",
        "query": "journal.cli.read:query",
        "release": "journal.cli.write:release",
        "report": "journal.cli.write:report",
        "schema": "journal.cli.scan:schema",
        "serve": "journal.cli.serve:serve",
        "show": "journal.cli.read:show",
        "stats": "journal.cli.scan:stats",
        "tail": "journal.cli.read:tail",
        "validate": "journal.cli.scan:validate",
    },
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(package_name="ilab-journal")
def main() -> None:
    """Inspect and steer training runs through their lifecycle journal.

    The trainer (rank 0) appends one JSON record per lifecycle event to
    <ckpt_dir>/journal.jsonl. These commands read it, for people (show, tail, stats, plot)
    and for scripts (status exit codes, query, --json output), and write control commands
    the trainer applies at the next step boundary (control).
    """


# -- status ---------------------------------------------------------------------------------


@main.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@stale_after_option
@click.option(
    "--full",
    is_flag=True,
    help="Read the whole journal instead of the index (journal.index.json) plus what came "
    "after it. Same answer, slower on long runs.",
)
@user_errors
def status(dir: str, as_json: bool, stale_after: float, full: bool) -> None:
    """Show the state of the latest attempt of a run.

    \b
    Exit codes (for cron/CI):
      0 completed    1 failed      2 usage error (bad DIR, not a journal)
      3 running      4 stopped     5 interrupted
      3 starting     (the launcher holds DIR, no record written yet)
      6 stale        (no record for --stale-after seconds, or the trainer
                      process is gone on this host, and no train_end)
      7 empty        (journal exists but holds no record yet)
    """
    from journal.views.index import summarize
    from journal.views.summary import STATE_EXIT_CODES, RunSummary

    given, path = Path(dir), resolve_journal(dir, must_exist=False)
    if given.is_dir() and not path.exists() and (held := run_holder(given)):
        # A launch in progress that has not written its journal yet: starting, not an error
        s = RunSummary(holder=held)
    else:
        path = resolve_journal(dir)
        folded = summarize(path, use_index=not full)
        run, invalid = folded.fold, folded.invalid
        require_journal(path, run.summarizer.summary.records, invalid)
        s = run.summary(stale_after=stale_after)
        s.invalid_lines = invalid
        s.holder = run_holder(path.parent)
        s.unapplied_commands = unapplied_count(path.parent)
        add_retention(s, path.parent)
    if s.state == "empty" and s.holder:
        s.state, s.reason = "starting", f"held by {holder_text(s.holder)}"
    if as_json:
        click.echo(dumps({**s.to_dict(), "journal": str(path)}))
    else:
        click.echo(status_text(s, path))
    sys.exit(STATE_EXIT_CODES.get(s.state, 1))


def unapplied_count(run_dir: Path) -> int:
    """How many commands arrived after the run ended. Most runs have no command file left
    in ``control/``: then the control channel's module is not imported (2 ms of
    ``status``'s start)."""
    try:
        if not json_files(control_dir(run_dir)):
            return 0
    except OSError:  # unreadable: as the channel reads it, nothing there
        return 0
    from journal.channels.control import unapplied_commands

    return len(unapplied_commands(run_dir)[1])


def add_retention(s: RunSummary, ckpt_dir: Path) -> None:
    """An ended run's checkpoints beyond keep_last_n that nothing holds any more: the
    trainer rotates no more, and a lease holder that died (a watcher killed with ``kill
    -9``) never releases; said by ``status``, removed by ``prune``. A running trainer
    rotates them at its next save. Cost: the run's checkpoint and lease dirs, not the
    journal."""
    if s.state in ("running", "starting", "empty") or not s.keep_last_n:
        return
    from journal.checkpoints.rotation import prunable  # only for a run that rotates

    best = (s.best_checkpoint or {}).get("checkpoint_path")
    keep = {Path(best).name} if isinstance(best, str) else set()
    paths, s.expired_leases = prunable(ckpt_dir, s.keep_last_n, keep=keep, run_id=s.run_id)
    s.prunable_checkpoints = [str(p) for p in paths]


if __name__ == "__main__":
    main()
