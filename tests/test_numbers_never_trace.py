"""No number a user types gives a traceback: every CLI option that takes a number (found
from the click commands themselves, so a new one is covered without editing this file), and
the numbers inside key=value options (listed here), given nan, inf, -1, 1e309, a word or a
5000-digit value, is refused in one line with exit 2 naming the option, or accepted by
design (:data:`ACCEPTED`, each with why).

The commands run in this process (click's CliRunner) and never start a worker or a
watcher that follows: ``ilab-train`` gets a checkpoint dir whose run lock this test holds
(an accepted value ends in exit 3, "busy", right after the settings' checks) and
``ilab-watch`` replays a finished three-record journal."""

from __future__ import annotations

import gc
import inspect
import signal
import time
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from journal import JournalWriter
from journal.cli.common import Seconds
from journal.cli.main import main as journal_main
from journal.rundir.lock import RunLock
from trainer.cli import main as train_main
from watcher.builtin.steering import DivergenceDetector, EarlyStopping
from watcher.cli.main import main as watch_main

BIG = "9" * 5000  # past Python's int-str conversion limit (4300 digits)
VALUES = {
    "nan": "nan",
    "inf": "inf",
    "-1": "-1",
    "1e309": "1e309",
    "abc": "abc",
    "5000-digits": BIG,
}
TOOLS: dict[str, click.Command] = {
    "ilab-journal": journal_main,
    "ilab-watch": watch_main,
    "ilab-train": train_main,
}

#: What each command needs besides the option under test ({run}: a finished run, {busy}: a
#: run dir whose launcher lock is held). A command with a numeric option that is missing
#: here fails the test: add it.
BASE: dict[str, list[str]] = {
    "ilab-train": ["--demo", "--ckpt-dir", "{busy}", "--backend", "gloo"],
    "ilab-watch": ["{run}", "--replay", "--quiet", "--on-save", "true"],
    "ilab-journal status": ["{run}"],
    "ilab-journal show": ["{run}"],
    "ilab-journal tail": ["{run}"],
    "ilab-journal stats": ["{run}"],
    "ilab-journal validate": ["{run}"],
    "ilab-journal export": ["{run}"],
    "ilab-journal check": ["{run}", "-e", "steps >= 0"],
    "ilab-journal control": ["stop", "{run}"],
    "ilab-journal lease": ["{run}", "step-000001"],
    "ilab-journal report": ["{run}", "x=1"],  # and with NAME=VALUE: accuracy={v} beside it
    "ilab-journal serve": ["{run}"],
    "ilab-journal backtest": ["{run}"],
}
#: Options that only count with another one.
COMPANIONS: dict[str, list[str]] = {
    "--job-poll": ["--via", "local"],
    "--ray-resources": ["--via", "ray", "--ray-address", "http://127.0.0.1:9"],
    "--linger": ["--mirror", "file://{tmp}/mirror"],
    "--limit": ["--lm-eval", "hellaswag"],
}


#: Numbers inside one option's text (or an argument's, in capitals): (command, option,
#: template with {v}, what the one line names). The built-in policies' numeric settings
#: come from their signatures.
def _policy_settings() -> Iterator[tuple[str, str, str, str]]:
    for kind, cls in (("--early-stopping", EarlyStopping), ("--divergence", DivergenceDetector)):
        for name, p in inspect.signature(cls).parameters.items():
            if p.annotation in ("int", "float", "float | None"):
                for tool in ("ilab-watch", "ilab-journal backtest"):
                    yield tool, kind, f"{name}={{v}}", name
                yield "ilab-journal backtest", kind, f"{name}=[1,{{v}}]", name
                yield "ilab-journal backtest", kind, f"{name}={{v}}..3", name


INNER: list[tuple[str, str, str, str]] = [
    *_policy_settings(),
    *[
        ("ilab-watch", "--ray-resources", f"{k}={{v}}", k)
        for k in ("num_cpus", "num_gpus", "memory", "accel")
    ],
    ("ilab-journal backtest", "--target", "accuracy>={v}", "--target"),
    ("ilab-journal backtest", "--keep-last-n", "{v}", "--keep-last-n"),
    ("ilab-journal backtest", "--keep-last-n", "[1,{v}]", "--keep-last-n"),
    ("ilab-journal check", "-e", "steps >= {v}", "steps >="),
    ("ilab-journal check", "-e", "best(val_loss) < {v}", "best(val_loss) <"),
    ("ilab-journal report", "NAME=VALUE", "accuracy={v}", "accuracy="),
    ("ilab-train", "--profile-steps", "{v}:3", "--profile-steps"),
]

#: ("command option [template]", value) accepted by design, and why. Anything else must
#: be refused.
ACCEPTED: dict[tuple[str, str], str] = {
    ("ilab-journal check -e steps >= {v}", "-1"): "a bound may be any finite number",
    ("ilab-journal check -e best(val_loss) < {v}", "-1"): "a metric may be negative",
    ("ilab-journal backtest --target accuracy>={v}", "-1"): "a metric may be negative",
    ("ilab-journal report NAME=VALUE accuracy={v}", "-1"): "a metric may be negative",
    ("ilab-journal report NAME=VALUE accuracy={v}", "abc"): "a report's value may be text",
}


def _walk(cmd: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            yield from _walk(sub, f"{path} {name}")
    else:
        yield path, cmd


def _numeric(param: click.Parameter) -> bool:
    """Whether a command-line value of ``param`` is a number (a pair of numbers too)."""
    kinds = (click.types.IntParamType, click.types.FloatParamType, Seconds)
    if isinstance(param.type, click.Tuple):
        return all(isinstance(t, kinds) for t in param.type.types)
    return isinstance(param.type, kinds) and not getattr(param, "count", False)


def numeric_options() -> list[tuple[str, str, int]]:
    """(command, its longest flag, how many values it takes) for every numeric option."""
    out = []
    for tool, root in TOOLS.items():
        for path, cmd in _walk(root, tool):
            for p in cmd.params:
                if isinstance(p, click.Option) and _numeric(p):
                    out.append((path, max(p.opts, key=len), p.nargs))
    return out


def cases() -> Iterator[Any]:
    for command, flag, nargs in numeric_options():
        for label, v in VALUES.items():
            given = [flag, *[v] * nargs] if nargs > 1 else [f"{flag}={v}"]
            args = [*COMPANIONS.get(flag, []), *given]
            yield pytest.param(command, flag, args, flag, label, id=f"{command} {flag} {label}")
    for command, flag, template, names in INNER:
        for label, v in VALUES.items():
            value = [template.format(v=v)]
            args = [*COMPANIONS.get(flag, []), *([] if flag.isupper() else [flag]), *value]
            where = f"{flag} {template}"
            yield pytest.param(command, where, args, names, label, id=f"{command} {where} {label}")


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("numbers")
    run, busy = tmp / "run", tmp / "busy"
    t = time.time() - 100
    with JournalWriter(run) as w:
        w.append("train_begin", {"config": {}}, ts=t)
        w.append("evaluate", {"val_loss": 1.0}, step=1, ts=t)
        w.append("train_end", {"status": "completed", "reason": "done"}, step=1, ts=t + 1)
    busy.mkdir()
    lock = RunLock(busy)  # held: an accepted ilab-train value ends in "busy", exit 3
    lock.acquire(timeout=5)
    yield {"run": str(run), "busy": str(busy), "tmp": str(tmp)}
    lock.release()


def invoke(command: str, args: list[str]) -> Result:
    """The command in this process; what ilab-watch sets process-wide is put back."""
    tool, *sub = command.split()
    threshold, handlers = gc.get_threshold(), {s: signal.getsignal(s) for s in (2, 15)}
    try:
        return CliRunner().invoke(TOOLS[tool], [*sub, *args])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        for s, h in handlers.items():
            signal.signal(s, h)


def error_lines(result: Result) -> list[str]:
    """The output without click's usage banner (``Usage: ...``, ``Try '... -h'``)."""
    return [
        line
        for line in result.output.splitlines()
        if line.strip() and not line.startswith(("Usage: ", "Try '"))
    ]


@pytest.mark.parametrize(("command", "where", "args", "names", "value"), list(cases()))
def test_a_number_is_refused_in_one_line_or_accepted_by_design(
    dirs: dict[str, str], command: str, where: str, args: list[str], names: str, value: str
) -> None:
    base = BASE.get(command)
    assert base is not None, f"{command} takes a number: add what it needs to BASE"
    argv = [a.format(**dirs) for a in (*base, *args)]
    result = invoke(command, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"{command} {where}: {result.exception!r}"
    )
    lines = error_lines(result)
    # the one line names the option (its flag, or its field for ilab-train's checks across
    # settings), or quotes the value (click: "No such option '-1'" where a value is optional)
    said = (names, names.lstrip("-").replace("-", "_"), f"'{VALUES[value][:20]}")
    refused = result.exit_code == 2 and len(lines) == 1 and any(n in lines[0] for n in said)
    if (f"{command} {where}", value) in ACCEPTED:
        assert not refused, f"{command} {where}: refused now; drop it from ACCEPTED"
    else:
        assert refused, f"{command} {where}: exit {result.exit_code}, {lines[-3:]}"


@pytest.mark.parametrize(
    ("command", "args", "code"),
    [
        ("ilab-train", ["--max-steps", "5", "--lr", "1e-3", "--adam-betas", "0.9", "0.95"], 3),
        ("ilab-watch", ["--retries", "1", "--early-stopping", "patience=2,min_delta=0.01"], 0),
        ("ilab-watch", ["--divergence", "threshold=none,relative_threshold=1.5,warmup=0"], 0),
        (
            "ilab-journal backtest",
            ["--early-stopping", "patience=1..3", "--keep-last-n", "[1,2]"],
            0,
        ),
        ("ilab-journal check", ["-e", "best(val_loss) < 1e3", "-e", "((not steps < 0))"], 0),
    ],
)
def test_good_numbers_pass_the_same_harness(
    dirs: dict[str, str], command: str, args: list[str], code: int
) -> None:
    """The harness above does tell: good values get past parsing (ilab-train to the held
    run lock: exit 3, busy, before any worker; the others to their normal end)."""
    result = invoke(command, [a.format(**dirs) for a in (*BASE[command], *args)])
    assert result.exit_code == code, result.output
