"""The code's shape: import direction (between packages and between trainer's subpackages),
no import cycle, one list of events, one envelope, small modules, a short trainer/ top."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from journal import JournalWriter, read_all
from journal.record.events import CALLBACK_EVENTS, ENVELOPE_FIELDS, EVENTS
from journal.record.schema import Record
from tests.helpers import ROOT

OURS = {"journal", "watcher", "trainer"}
#: package -> the project packages it may import (journal is the base).
ALLOWED = {"journal": {"journal"}, "watcher": {"journal", "watcher"}, "trainer": OURS}
MAX_MODULE_LINES = 400
#: Modules directly in trainer/ (``__init__`` and ``cli`` included): the rest live in the
#: subpackages, whose names say what they hold.
MAX_TRAINER_TOP_MODULES = 8

#: trainer's layers: subpackage (or top-level module) -> the trainer subpackages it may
#: import, besides itself. Read bottom-up: config (no torch) is the base; data, then model,
#: then checkpoint build on it; steering (control commands, reports, decisions) then
#: journaling (rank 0's journal client) sit under both rank (inside torchrun) and the
#: bridges; launch (the launching process) never imports rank, steering or journaling
#: (its model import is the lazy one of a GGUF conversion); instructlab and cli start runs.
LAYERS: dict[str, set[str]] = {
    "config": set(),
    "data": {"config"},
    "model": {"config", "data"},
    "checkpoint": {"config", "data", "model"},
    "steering": {"config"},
    "journaling": {"config", "steering"},
    "rank": {"config", "data", "model", "checkpoint", "steering", "journaling"},
    "integrations": {"config", "steering", "journaling"},
    "launch": {"config", "data", "model"},
    "instructlab": {"config", "launch"},
    "cli": {"config", "data", "launch", "instructlab"},
}
#: The only part of trainer that may import the watcher: the launcher runs its embedded
#: watcher and exporters; a torchrun worker (rank) never loads it.
MAY_IMPORT_WATCHER = {"launch"}


def _modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``, subpackages included, by dotted name."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement: lazy (in a function) ones and ``if TYPE_CHECKING:`` ones
    too. A type-only import never runs, but two modules that name each other's types are
    one concern split in two: the layering counts it like any other."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _import_nodes(node)


def _imported(name: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement of module ``name`` (at ``path``) may load:
    ``from pkg import mod`` names ``pkg.mod`` as well as ``pkg``."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        anchor = package[: len(package) - node.level + 1]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    return [base, *(f"{base}.{a.name}" for a in node.names)]


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (lazy imports included).

    ``from pkg import mod`` is an edge to ``pkg.mod``; ``from pkg import name`` (not a
    module) one to ``pkg`` itself, whose ``__init__`` runs the imports it holds."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in _import_nodes(ast.parse(path.read_text())):
            names = _imported(name, path, node)
            if isinstance(node, ast.Import):
                deps.update(n for n in names if n in modules)
                continue
            deps.update(n for n in names[1:] if n in modules)
            if not all(n in modules for n in names[1:]):  # a name from the package itself
                deps.update(names[:1])
        graph[name] = (deps & modules.keys()) - {name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The sets of modules that import each other, directly or round a loop (the strongly
    connected components of more than one module), each sorted."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in order:
            visit(v)
    return sorted(cycles)


def _imports(path: Path) -> set[str]:
    """Top-level project packages a module imports, anywhere in it (lazy imports too)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.add(node.module.split(".")[0])
    return out & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package: str) -> None:
    """journal imports nothing of ours, watcher only journal, trainer both (subpackages
    such as trainer/integrations/ included)."""
    bad = {
        str(p.relative_to(ROOT)): sorted(_imports(p) - ALLOWED[package])
        for p in _modules(ROOT, package).values()
        if _imports(p) - ALLOWED[package]
    }
    assert not bad, bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_cycles_inside_a_package(package: str) -> None:
    """No module of a package imports one that imports it back, at the top, lazily in a
    function or under ``if TYPE_CHECKING:`` (a lazy or type-only import only hides the
    cycle)."""
    assert import_cycles(import_graph(ROOT, package)) == []


def _layer(module: str) -> str:
    """trainer.rank.loop -> rank; trainer.cli -> cli; trainer -> trainer."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def test_trainer_layers() -> None:
    """Each trainer subpackage imports only the ones below it in LAYERS (lazy and type-only
    imports included), so the subpackages form no cycle either, and every subpackage and
    top-level module has its row."""
    graph = import_graph(ROOT, "trainer")
    layers = {_layer(m) for m in graph} - {"trainer"}
    assert layers == set(LAYERS), "give each trainer subpackage its row in LAYERS"
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if _layer(m) != "trainer" and _layer(d) != _layer(m) and _layer(d) not in LAYERS[_layer(m)]
    )
    assert not bad, bad
    assert import_cycles(LAYERS) == []


def test_only_the_launcher_imports_the_watcher() -> None:
    """The rank side (and every other part but the launcher) never imports the watcher."""
    bad = sorted(
        str(p.relative_to(ROOT))
        for name, p in _modules(ROOT, "trainer").items()
        if "watcher" in _imports(p) and _layer(name) not in MAY_IMPORT_WATCHER
    )
    assert not bad, bad


def test_trainer_top_stays_short() -> None:
    """At most MAX_TRAINER_TOP_MODULES modules directly in trainer/: a new module goes
    into the subpackage of its process or concern."""
    top = sorted(p.name for p in (ROOT / "trainer").glob("*.py"))
    assert len(top) <= MAX_TRAINER_TOP_MODULES, top


def test_every_module_says_what_it_is_for() -> None:
    """Each module (``__init__`` included) opens with a docstring."""
    bare = sorted(
        str(p.relative_to(ROOT))
        for pkg in ALLOWED
        for p in _modules(ROOT, pkg).values()
        if not ast.get_docstring(ast.parse(p.read_text()))
    )
    assert not bare, bare


def test_the_cycle_check_finds_lazy_and_relative_cycles(tmp_path: Path) -> None:
    """The check itself can fail: a tiny package with a lazy cycle in a subpackage, a
    cycle through relative imports, and one through a TYPE_CHECKING-only import."""
    files = {
        "pkg/__init__.py": "def f():\n    from pkg.h import VALUE\n",
        "pkg/a.py": "from pkg import b\n",
        "pkg/b.py": "def f():\n    from pkg.sub.c import x\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "import pkg.a\nx = 1\n",
        "pkg/d.py": "from .e import y\n",
        "pkg/e.py": "from . import d\ny = 2\n",
        "pkg/f.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import g\n",
        "pkg/g.py": "from pkg.f import TYPE_CHECKING\n",
        "pkg/h.py": "from pkg import i, VALUE\n",  # VALUE comes from pkg/__init__.py
        "pkg/i.py": "",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert import_cycles(import_graph(tmp_path, "pkg")) == [
        ["pkg", "pkg.h"],
        ["pkg.a", "pkg.b", "pkg.sub.c"],
        ["pkg.d", "pkg.e"],
        ["pkg.f", "pkg.g"],
    ]


def test_workers_do_not_load_the_watcher() -> None:
    """A torchrun worker imports the trainer only: no watcher engine in every rank."""
    code = (
        "import sys, trainer.rank.worker\n"
        "bad = sorted(m for m in sys.modules if m == 'watcher' or m.startswith('watcher.'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_modules_stay_small() -> None:
    sizes = {
        str(p.relative_to(ROOT)): len(p.read_text().splitlines())
        for pkg in ALLOWED
        for p in _modules(ROOT, pkg).values()
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
    from watcher.cli.main import main as ilab_watch

    options = {opt for p in ilab_watch.params for opt in getattr(p, "opts", [])}
    assert {f"--on-{e.replace('_', '-')}" for e in EVENTS} <= options


def test_one_envelope(tmp_path: Path) -> None:
    """The writer's records, the schema and ENVELOPE_FIELDS name the same fields, in order."""
    with JournalWriter(tmp_path) as w:
        w.append("log", {"loss": 1.0})
    rec = read_all(tmp_path / "journal.jsonl").records[0]
    assert tuple(rec) == ENVELOPE_FIELDS
    assert tuple(Record.model_fields) == ENVELOPE_FIELDS
