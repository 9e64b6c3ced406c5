"""``ilab-watch --lm-eval TASKS``: a ``save`` command hook that runs lm-eval on each save's
Hugging Face export and reports every metric it returns (watcher/lmeval/job.py). Being a
command hook, it composes with the rest: ``--via slurm|local|ray`` runs it as a job,
``--queue save=latest`` evaluates only the newest checkpoint, and the checkpoint stays
leased until its evaluation ends.

What can be known at the watcher's start is checked there, one line each (exit 2): lm-eval
not installed, a task it does not know (looked up in ``--include-path`` first, then in
lm-eval's own tasks), options without ``--lm-eval``, an lm-eval option ilab-watch sets
itself given in ``--lm-eval-args`` (any spelling lm-eval's parser takes: :func:`owned_option`).
A checkpoint lm-eval cannot load is known at its save: that delivery fails with lm-eval's
one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from journal.cli.common import Number

LM_EVAL_OPTIONS = [
    click.option(
        "--lm-eval",
        "lm_eval_tasks",
        metavar="TASKS",
        help="Run lm-evaluation-harness on each save's HF export (comma-separated tasks, e.g. "
        "hellaswag,arc_easy) and report every metric as TASK/METRIC (hellaswag/acc_norm), for "
        "--keep-best and --early-stopping. Needs ilab-journal[lm-eval].",
    ),
    click.option(
        "--lm-eval-args",
        metavar="ARGS",
        help="With --lm-eval: more lm-eval options, e.g. '--batch_size 8 --num_fewshot 5' "
        "(--model_args are added to pretrained=<hf_path>).",
    ),
    click.option(
        "--limit",
        "lm_eval_limit",
        type=Number(0, low_open=True),  # FloatRange let nan and inf through
        metavar="N",
        help="With --lm-eval: at most N examples per task (a fraction below 1).",
    ),
    click.option(
        "--include-path",
        "lm_eval_include",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        metavar="DIR",
        help="With --lm-eval: a folder of your own task YAML files.",
    ),
]

#: Run by the watcher's Python before the first save: exit 3 when lm_eval is missing,
#: 4 with the unknown task names on stdout.
_CHECK = """
import sys
try:
    from lm_eval.tasks import TaskManager
except ImportError as exc:
    print(exc); sys.exit(3)
tasks, include = sys.argv[1].split(","), sys.argv[2] or None
missing = tasks
if include:
    local = TaskManager(include_path=include, include_defaults=False)
    missing = [t for t in tasks if t not in local.all_tasks]
if missing:
    missing = [t for t in missing if t not in TaskManager(include_path=include).all_tasks]
print(",".join(missing)); sys.exit(4 if missing else 0)
"""


#: lm-eval ``run`` options ilab-watch sets itself (by argparse dest): lm-eval 0.4.13's
#: spellings (used where lm-eval's own parser cannot be read) and what to use instead.
_OWNED: dict[str, tuple[list[str], str | None]] = {
    "tasks": (["--tasks", "-t"], "--lm-eval TASKS"),
    "limit": (["--limit", "-L"], "--limit N"),
    "output_path": (["--output_path", "-o"], None),  # the job reads results from its own dir
    "include_path": (["--include_path"], "--include-path DIR"),
}

#: Run by the watcher's Python: lm-eval's ``run`` parser, as JSON (its options' strings,
#: dests and nargs, and whether it takes abbreviations); exit 3 when lm_eval is missing.
_PARSER = """
import argparse, json, sys
try:
    from lm_eval._cli.run import Run
except ImportError as exc:
    print(exc); sys.exit(3)
run = Run.create(argparse.ArgumentParser().add_subparsers())._parser
rows = [[a.option_strings, a.dest, a.nargs] for a in run._actions if a.option_strings]
print(json.dumps({"allow_abbrev": run.allow_abbrev, "prefix_chars": run.prefix_chars, "options": rows}))
"""


class _Sets(Exception):
    """The probe met an option ilab-watch sets (its dest: the one argument)."""


class _Unparsed(Exception):
    """The probe could not parse a prefix of the arguments (lm-eval could not either)."""


class _Probe(argparse.ArgumentParser):
    """argparse itself on lm-eval's options: it raises where a parser would exit."""

    def error(self, message: str) -> NoReturn:
        raise _Unparsed(message)


class _Owned(argparse.Action):
    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        raise _Sets(self.dest)


def _lm_eval_parser() -> dict[str, Any]:
    """lm-eval's ``run`` options as its installed version parses them (:data:`_PARSER`);
    where it cannot be read (lm_eval not installed), the spellings in :data:`_OWNED`."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PARSER], capture_output=True, text=True, timeout=120
        )
        if done.returncode == 0:
            parsed: dict[str, Any] = json.loads(done.stdout)
            return parsed
    except (subprocess.SubprocessError, OSError, ValueError):
        pass
    rows = [[spellings, dest, None] for dest, (spellings, _) in _OWNED.items()]
    return {"allow_abbrev": True, "prefix_chars": "-", "options": rows}


def owned_option(args: list[str]) -> tuple[str, str, str | None] | None:
    """The first of ``args`` that lm-eval would read as an option ilab-watch sets, as
    ``(the argument, the option's name, what to use instead)``; None when there is none.
    argparse reads them here on lm-eval's own options, so every spelling it takes counts:
    ``-t``, ``-ty``, ``-xt`` (joined short flags), ``--tasks=y``, ``--tas`` (a prefix)."""
    table = _lm_eval_parser()
    probe = _Probe(
        add_help=False, allow_abbrev=table["allow_abbrev"], prefix_chars=table["prefix_chars"]
    )
    names: dict[str, str] = {}
    for strings, dest, nargs in table["options"]:
        if dest in _OWNED:
            probe.add_argument(*strings, dest=dest, nargs="?", action=_Owned)
            names[dest] = next((s for s in strings if s.startswith("--")), strings[0])
        elif nargs == 0:
            probe.add_argument(*strings, dest=dest, action="store_true")
        else:
            probe.add_argument(*strings, dest=dest, nargs=nargs)
    # argparse acts on options from left to right: the shortest prefix of ``args`` that
    # reaches an owned option ends with the argument that names it
    for k in range(1, len(args) + 1):
        try:
            probe.parse_known_args(args[:k])
        except _Sets as hit:
            dest = hit.args[0]
            return args[k - 1], names[dest], _OWNED[dest][1]
        except _Unparsed:
            continue
    return None


def _escape(text: str) -> str:
    """``text`` as a literal in a command hook: ``{`` and ``}`` are not placeholders."""
    return text.replace("{", "{{").replace("}", "}}")


def lm_eval_command(
    tasks: str, limit: float | None, include_path: Path | None, extra: str | None
) -> str:
    """The ``save`` hook's command line (the watcher's Python runs the job module)."""
    argv = [sys.executable, "-m", "watcher.lmeval.job", "--tasks", tasks]
    if limit is not None:
        argv += ["--limit", f"{limit:g}"]
    if include_path is not None:
        argv += ["--include-path", str(include_path.resolve())]
    if extra:
        argv += ["--args", extra]
    return _escape(shlex.join(argv))


def check_lm_eval(tasks: list[str], include_path: Path | None) -> None:
    """The start-up checks (module docstring); click.UsageError with one line."""
    if importlib.util.find_spec("lm_eval") is None:
        raise click.UsageError(
            "--lm-eval: lm_eval is not installed (pip install 'ilab-journal[lm-eval]')"
        )
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHECK, ",".join(tasks), str(include_path or "")],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        return  # the deliveries will say what is wrong, if anything
    last = (done.stdout.strip().splitlines() or [""])[-1]
    if done.returncode == 3:
        raise click.UsageError(f"--lm-eval: lm_eval cannot be imported: {last}")
    if done.returncode == 4:
        where = f" nor in {include_path}" if include_path else ""
        raise click.UsageError(
            f"--lm-eval: unknown task(s) {last} (not among lm-eval's tasks{where}); "
            "`lm-eval ls tasks` lists them"
        )
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        raise click.UsageError(f"--lm-eval: {lines[-1] if lines else 'task check failed'}")


def lm_eval_hook(
    tasks: str | list[str],
    *,
    limit: float | None = None,
    include_path: str | Path | None = None,
    args: str | None = None,
    check: bool = True,
) -> str:
    """The ``save`` command of ``--lm-eval``, for ``run_training``'s ``on_save`` (its
    embedded watcher runs it as ``ilab-watch`` would): ``TrainingArgs(...,
    on_save=lm_eval_hook("hellaswag", limit=500))``. ``check``: lm-eval installed and the
    tasks known, now. A mistake is a ValueError of one line."""
    names = tasks if isinstance(tasks, str) else ",".join(tasks)
    folder = Path(include_path) if include_path is not None else None
    if folder is not None and not folder.is_dir():
        raise ValueError(f"include_path {folder} is not a directory")
    try:
        return lm_eval_pairs(names, args, limit, folder, check=check)[0][1]
    except click.UsageError as exc:
        raise ValueError(exc.format_message()) from None


def lm_eval_pairs(
    tasks: str | None,
    args: str | None,
    limit: float | None,
    include_path: Path | None,
    *,
    check: bool = True,
) -> list[tuple[str, str]]:
    """The ``("save", command)`` hook of ``--lm-eval`` (none without it), checked."""
    if tasks is None:
        options = {"--lm-eval-args": args, "--limit": limit, "--include-path": include_path}
        if given := [name for name, v in options.items() if v is not None]:
            raise click.UsageError(f"{', '.join(given)} need(s) --lm-eval TASKS")
        return []
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise click.UsageError("--lm-eval: give at least one task, e.g. --lm-eval hellaswag")
    if args:
        try:
            split = shlex.split(args)
        except ValueError as exc:
            raise click.UsageError(f"--lm-eval-args: {exc}") from None
        if (owned := owned_option(split)) is not None:
            arg, name, instead = owned
            said = arg if arg == name else f"{arg} (lm-eval's {name})"
            use = f" (use {instead})" if instead else ""
            raise click.UsageError(f"--lm-eval-args: {said} is set by ilab-watch{use}")
    if check:
        check_lm_eval(names, include_path)
    return [("save", lm_eval_command(",".join(names), limit, include_path, args))]
