"""``ilab-journal``'s commands that read a journal whole: ``stats`` and ``validate`` (in
parallel parts for a large journal), ``plot``, and ``schema`` (what ``validate`` checks
against). Imported when named (journal/cli/main.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import orjson

from journal.cli.common import as_user_error, dumps, require_journal, user_errors
from journal.cli.format import stats_text
from journal.record.text import printable
from journal.remote.readers import RUN_DIR_OR_URI
from journal.rundir.paths import resolve_journal

# -- stats ----------------------------------------------------------------------------------


JOBS_OPTION = click.option(
    "--jobs",
    type=click.IntRange(min=1),
    help="Processes that scan parts of a large journal at once "
    "[default: one per core, at most 4, one per 16 MB].",
)


@click.command()
@click.argument("dir", type=RUN_DIR_OR_URI)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@JOBS_OPTION
@user_errors
def stats(dir: str, as_json: bool, jobs: int | None) -> None:
    """Counts per event, time per phase (step, evaluate, save) and throughput."""
    from journal.views.stats import journal_stats

    path = resolve_journal(dir)
    st, invalid = journal_stats(path, jobs)
    require_journal(path, sum(st.counts.values()), invalid)
    d = st.to_dict()
    d["invalid_lines"] = invalid
    if as_json:
        click.echo(dumps(d))
        return
    click.echo(stats_text(d))


# -- validate -------------------------------------------------------------------------------


@click.command()
@click.argument("dir", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the findings as one JSON object.")
@JOBS_OPTION
@user_errors
def validate(dir: str, as_json: bool, jobs: int | None) -> None:
    """Check every record against the schema, seq order and line integrity.

    Exit 0 when the journal is sound, 1 when anything is corrupt (invalid lines, schema
    violations, seq not strictly increasing, unexplained seq gaps), 2 on usage errors.
    A torn final line (a writer may still be appending) is a warning only.
    """
    from journal.views.validate import validate_journal

    path = resolve_journal(dir)
    report = validate_journal(path, jobs=jobs)
    require_journal(path, report.records, report.invalid_lines)
    problems, count, valid = report.problems, report.problem_count, report.records
    ok = report.ok
    if as_json:
        out = {"ok": ok, "records": valid, "problems": problems, "problem_count": count}
        click.echo(dumps({**out, "warnings": report.warnings}))
    else:
        for w in report.warnings:
            click.echo(f"warning: {printable(w)}", err=True)
        for p in problems[:50]:
            click.echo(f"error: {printable(p)}")
        if count > 50:
            click.echo(f"... and {count - 50} more")
        click.echo(f"{path}: {valid} records, {count} problems: {'OK' if ok else 'CORRUPT'}")
    sys.exit(0 if ok else 1)


# -- schema ---------------------------------------------------------------------------------


@click.command()
def schema() -> None:
    """Print the JSON Schema (draft 2020-12) of one journal record."""
    from journal.record.schema import json_schema

    click.echo(orjson.dumps(json_schema(), option=orjson.OPT_INDENT_2).decode())


# -- plot -----------------------------------------------------------------------------------


@click.command()
@click.argument("dir", type=click.Path())
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False),
    help="PNG path (default: <ckpt_dir>/journal.png).",
)
@user_errors
def plot(dir: str, output: str | None) -> None:
    """Plot loss, val_loss and learning rate per step to a PNG (needs the 'plot' extra)."""
    from journal.cli.plot import MissingPlotExtra, NothingToPlot, plot_journal

    path = resolve_journal(dir)
    out = Path(output) if output else path.parent / "journal.png"
    with as_user_error(MissingPlotExtra, NothingToPlot):
        plot_journal(path, out)
    click.echo(str(out))
