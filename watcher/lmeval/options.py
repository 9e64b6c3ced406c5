"""``ilab-watch --lm-eval TASKS``: a ``save`` command hook that runs lm-eval on each save's
Hugging Face export and reports every metric it returns (watcher/lmeval/job.py). Being a
command hook, it composes with the rest: ``--via slurm|local|ray`` runs it as a job,
``--queue save=latest`` evaluates only the newest checkpoint, and the checkpoint stays
leased until its evaluation ends.

What can be known at the watcher's start is checked there, one line each (exit 2): lm-eval
not installed, a task it does not know (looked up in ``--include-path`` first, then in
lm-eval's own tasks), options without ``--lm-eval``. A checkpoint lm-eval cannot load is
known at its save: that delivery fails with lm-eval's one line.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import click

LM_EVAL_OPTIONS = [
    click.option(
        "--lm-eval",
        "lm_eval_tasks",
        default=None,
        metavar="TASKS",
        help="Run lm-evaluation-harness on each save's HF export (comma-separated tasks, e.g. "
        "hellaswag,arc_easy) and report every metric as TASK/METRIC (hellaswag/acc_norm), for "
        "--keep-best and --early-stopping. Needs ilab-journal[lm-eval].",
    ),
    click.option(
        "--lm-eval-args",
        default=None,
        metavar="ARGS",
        help="With --lm-eval: more lm-eval options, e.g. '--batch_size 8 --num_fewshot 5' "
        "(--model_args are added to pretrained=<hf_path>).",
    ),
    click.option(
        "--limit",
        "lm_eval_limit",
        type=click.FloatRange(min=0, min_open=True),
        default=None,
        metavar="N",
        help="With --lm-eval: at most N examples per task (a fraction below 1).",
    ),
    click.option(
        "--include-path",
        "lm_eval_include",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        default=None,
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
        given = [
            name
            for name, v in (
                ("--lm-eval-args", args),
                ("--limit", limit),
                ("--include-path", include_path),
            )
            if v is not None
        ]
        if given:
            raise click.UsageError(f"{', '.join(given)} need(s) --lm-eval TASKS")
        return []
    names = [t.strip() for t in tasks.split(",") if t.strip()]
    if not names:
        raise click.UsageError("--lm-eval: give at least one task, e.g. --lm-eval hellaswag")
    if args:
        try:
            split: Any = shlex.split(args)
        except ValueError as exc:
            raise click.UsageError(f"--lm-eval-args: {exc}") from None
        clash = [a for a in split if a.split("=")[0] in ("--tasks", "--output_path", "--limit")]
        if clash:
            raise click.UsageError(
                f"--lm-eval-args: {clash[0]} is set by ilab-watch (use --lm-eval / --limit)"
            )
    if check:
        check_lm_eval(names, include_path)
    return [("save", lm_eval_command(",".join(names), limit, include_path, args))]
