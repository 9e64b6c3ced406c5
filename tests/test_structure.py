"""The code's shape: import direction, one list of events, one envelope, small modules."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from journal import JournalWriter, read_all
from journal.events import CALLBACK_EVENTS, ENVELOPE_FIELDS, EVENTS
from journal.schema import Record
from tests.conftest import ROOT

OURS = {"journal", "watcher", "trainer"}
#: package -> the project packages it may import (journal is the base).
ALLOWED = {"journal": {"journal"}, "watcher": {"journal", "watcher"}, "trainer": OURS}
MAX_MODULE_LINES = 400


def _imports(path: Path) -> set[str]:
    """Top-level project packages a module imports, anywhere in it (lazy imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package: str) -> None:
    """journal imports nothing of ours, watcher only journal, trainer both."""
    bad = {
        str(p.relative_to(ROOT)): sorted(_imports(p) - ALLOWED[package])
        for p in (ROOT / package).glob("*.py")
        if _imports(p) - ALLOWED[package]
    }
    assert not bad, bad


def test_workers_do_not_load_the_watcher() -> None:
    """A torchrun worker imports the trainer only: no watcher engine in every rank."""
    code = (
        "import sys, trainer.worker\n"
        "bad = sorted(m for m in sys.modules if m == 'watcher' or m.startswith('watcher.'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_modules_stay_small() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for pkg in ALLOWED
        for p in (ROOT / pkg).glob("*.py")
    }
    assert {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES} == {}


def test_one_list_of_hookable_events() -> None:
    """TrainingArgs fields, TrainerCallback methods and ilab-watch options follow events.py."""
    from trainer.config import TrainingArgs
    from watcher import TrainerCallback

    fields = {f for f in TrainingArgs.model_fields if f.startswith("on_")}
    assert fields == {f"on_{e}" for e in CALLBACK_EVENTS}
    methods = {n for n, _ in inspect.getmembers(TrainerCallback) if n.startswith("on_")}
    assert methods == {f"on_{e}" for e in CALLBACK_EVENTS}
    for name in methods:  # each hook says when it fires
        assert "Fires when" in (getattr(TrainerCallback, name).__doc__ or ""), name
    assert set(CALLBACK_EVENTS) <= set(EVENTS)
    from watcher.cli import main as ilab_watch

    options = {opt for p in ilab_watch.params for opt in getattr(p, "opts", [])}
    assert {f"--on-{e.replace('_', '-')}" for e in EVENTS} <= options


def test_one_envelope(tmp_path: Path) -> None:
    """The writer's records, the schema and ENVELOPE_FIELDS name the same fields, in order."""
    with JournalWriter(tmp_path) as w:
        w.append("log", {"loss": 1.0})
    rec = read_all(tmp_path / "journal.jsonl").records[0]
    assert tuple(rec) == ENVELOPE_FIELDS
    assert tuple(Record.model_fields) == ENVELOPE_FIELDS
