"""The code's shape: import direction (between packages, and between the rooms of each:
its subpackages and top-level modules), no import cycle, no trainer module run by a string
path from journal/ or watcher/, one list of events, one envelope, small modules, short
package tops.

Each check is a function of a root directory (``check_*``), so that a test can plant a
violation in a copy of a package and see the check fail on it."""

from __future__ import annotations

import ast
import inspect
import itertools
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from journal import JournalWriter, read_all
from journal.record.events import CALLBACK_EVENTS, ENVELOPE_FIELDS, EVENTS
from journal.record.schema import RecordModel
from tests.helpers import ROOT

OURS = {"journal", "watcher", "trainer"}
#: package -> the project packages it may import (journal is the base).
ALLOWED = {"journal": {"journal"}, "watcher": {"journal", "watcher"}, "trainer": OURS}
#: An alarm, not a target: a module grows past it only by a concept that should stand alone.
MAX_MODULE_LINES = 600
#: Modules directly in trainer/ (``__init__`` and ``cli`` included): the rest live in the
#: subpackages, whose names say what they hold.
MAX_TRAINER_TOP_MODULES = 8
#: The same for every package: a new module goes into the folder of its concern.
MAX_TOP_MODULES = {"journal": 8, "watcher": 8, "trainer": MAX_TRAINER_TOP_MODULES}

#: trainer's layers: room (subpackage, or top-level module: ``__init__`` is the package's
#: own) -> the trainer rooms it may import, besides itself. Read bottom-up: config (no
#: torch) is the base; data, then model, then checkpoint build on it; steering (control
#: commands, reports, decisions) then journaling (rank 0's journal client) sit under both
#: rank (inside torchrun) and the bridges; launch (the launching process) never imports
#: rank, steering or journaling (its model import is the lazy one of a GGUF conversion);
#: instructlab and cli start runs.
LAYERS: dict[str, set[str]] = {
    "__init__": set(),
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

#: journal's layers, the same way; each row is what the room imports today (the fewest
#: edges that hold), within the order: record (events, schema, fields, text: the base)
#: <- rundir (a run dir's paths, files, lock, inbox) <- read <- views (index, query,
#: summary, validate) and write (the writer keeps the views' index) <- checkpoints
#: (leases, rotation) <- store (the one way into and out of a run dir's journal: it opens
#: an attempt from its checkpoint, and prunes as a guest) <- channels (control, reports,
#: jobs) <- remote (a run in object storage)
#: <- cli (``ilab-journal``); ``__init__`` (the public names) on top.
JOURNAL_LAYERS: dict[str, set[str]] = {
    "record": set(),
    "rundir": set(),
    "read": {"record"},
    "views": {"record", "rundir", "read"},
    "write": {"record", "rundir", "read", "views"},
    # store: the one way into and out of a run dir's journal (journal/store.py)
    "store": {"record", "rundir", "read", "views", "write", "checkpoints"},
    "channels": {"record", "rundir", "read", "write", "store"},
    "checkpoints": {"rundir", "read", "views", "write"},
    "remote": {"rundir", "store", "checkpoints"},
    # serve: the web page (ilab-journal serve) over the readers, views, leases and commands;
    # record: which numbers the trainer itself logs (always a curve)
    "serve": {"record", "rundir", "read", "views", "store", "channels", "checkpoints"},
    # ask: check's expressions over a summary (views), waiting on leases (checkpoints) and
    # on jobs not yet in a final state (channels); its number literals judged by record's
    "ask": {"record", "rundir", "read", "views", "store", "channels", "checkpoints"},
    "cli": {
        "record",
        "rundir",
        "read",
        "views",
        "store",
        "channels",
        "checkpoints",
        "remote",
        "serve",
        "ask",
    },
    "__init__": {"record", "rundir", "read", "write", "channels"},
}

#: watcher's layers: hooks (a hook, its callbacks, commands and deliveries) is the base;
#: the engine (follow -> dispatch -> queue -> complete) builds on it and imports neither
#: the scheduler nor the exporters: they build on the engine's interfaces (the scheduler
#: runs the engine's jobs), as do the built-in callbacks; mirror brings a remote run in for
#: the engine; assembly makes one watcher of what cli (``ilab-watch``) and embedded (the
#: launcher's watcher) ask for.
WATCHER_LAYERS: dict[str, set[str]] = {
    "hooks": set(),
    "engine": {"hooks"},
    "scheduler": {"hooks", "engine"},
    "exporters": {"hooks"},
    "builtin": {"hooks"},
    "mirror": {"engine"},
    "lmeval": set(),  # --lm-eval: a command hook's command line and the job it runs
    # alerts: the journal's alert rules are a callback object (hooks) reading the built-in
    # DivergenceDetector (builtin); hangs, deaths and their evidence need neither
    "alerts": {"hooks", "builtin"},
    "assembly": {"hooks", "engine", "exporters"},
    "cli": {"hooks", "engine", "scheduler", "exporters", "builtin", "mirror", "lmeval", "alerts"}
    | {"assembly"},
    "embedded": {"hooks", "engine", "exporters", "assembly"},
    # backtest: past journals through the watcher's executor (engine), callbacks and built-ins;
    # --hang-after through the live guard's own rule (alerts)
    "backtest": {"hooks", "engine", "builtin", "alerts"},
    "__init__": {"hooks", "engine", "builtin"},
}

#: package -> its layers.
ROOMS = {"journal": JOURNAL_LAYERS, "watcher": WATCHER_LAYERS, "trainer": LAYERS}

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


def _room(module: str) -> str:
    """The room a module lives in: trainer.rank.loop -> rank; trainer.cli -> cli; the
    package's own ``__init__`` (trainer) -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


# -- the checks: each a function of a root directory, failing with what it found ----------


def check_import_direction(root: Path, package: str) -> None:
    """``package`` imports only the project packages ALLOWED says."""
    bad = {
        str(p.relative_to(root)): sorted(_imports(p) - ALLOWED[package])
        for p in _modules(root, package).values()
        if _imports(p) - ALLOWED[package]
    }
    assert not bad, f"{package}: imports another package of ours: {bad}"


def check_no_cycles(root: Path, package: str) -> None:
    """No module of ``package`` imports one that imports it back, directly or round a loop."""
    cycles = import_cycles(import_graph(root, package))
    assert not cycles, f"{package}: import cycles: {cycles}"


def check_layers(root: Path, package: str, layers: dict[str, set[str]]) -> None:
    """Every room of ``package`` has its row in ``layers``, imports only the rooms on it
    (lazy and ``if TYPE_CHECKING:`` imports count), and the rows form no cycle."""
    graph = import_graph(root, package)
    rooms = {_room(m) for m in graph}
    assert rooms == set(layers), (
        f"{package}: give each room its row in the layers (and only rooms): "
        f"no row: {sorted(rooms - set(layers))}, no room: {sorted(set(layers) - rooms)}"
    )
    bad = sorted(
        f"{m} -> {d}"
        for m, deps in graph.items()
        for d in deps
        if _room(d) != _room(m) and _room(d) not in layers[_room(m)]
    )
    assert not bad, f"{package}: imports against its layers: {bad}"
    assert import_cycles(layers) == [], f"{package}: its layers form a cycle"


def check_top_stays_short(root: Path, package: str) -> None:
    """At most MAX_TOP_MODULES[package] modules directly in ``package``/ (``__init__``
    counted): a new module goes into the folder of its concern."""
    top = sorted(p.name for p in (root / package).glob("*.py"))
    most = MAX_TOP_MODULES[package]
    assert len(top) <= most, f"{package}/: {len(top)} modules at its top (at most {most}): {top}"


def check_modules_stay_small(root: Path, package: str) -> None:
    """No module of ``package`` over MAX_MODULE_LINES lines."""
    sizes = {
        str(p.relative_to(root)): len(p.read_text().splitlines())
        for p in _modules(root, package).values()
    }
    big = {k: v for k, v in sizes.items() if v > MAX_MODULE_LINES}
    assert not big, f"{package}: modules over {MAX_MODULE_LINES} lines: {big}"


#: ``-m trainer`` or ``-m trainer.x`` within one string (a command line, an f-string's text).
_RUNS_TRAINER = re.compile(r"-m\s+trainer\b")


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's text up to its first ``{}``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        return _text(node.values[0])
    return None


def trainer_runs(root: Path, package: str) -> list[str]:
    """Where ``package`` names a trainer module to run with ``python -m``: in one string
    (``"python -m trainer.x"``) or as two items in a row (``[..., "-m", "trainer.x"]``, a
    list, tuple or call's arguments). Docstrings count: they are strings too."""
    hits = []
    for path in _modules(root, package).values():
        where = path.relative_to(root)
        for node in ast.walk(ast.parse(path.read_text())):
            text = _text(node) if isinstance(node, ast.Constant) else None
            found = _RUNS_TRAINER.search(text) if text is not None else None
            if text is not None and found:  # the line of the match, in a docstring too
                line = node.lineno + text.count("\n", 0, found.start())
                hits.append(f"{where}:{line}: {' '.join(text[found.start() :].split()[:2])!r}")
            if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
                items = node.elts
            else:
                items = node.args if isinstance(node, ast.Call) else []
            for a, b in itertools.pairwise(items):
                run = _text(b) or ""
                if _text(a) == "-m" and re.match(r"trainer\b", run):
                    hits.append(f"{where}:{a.lineno}: '-m', {run!r}")
    return hits


def check_runs_no_trainer_module(root: Path, package: str) -> None:
    """``package`` runs no trainer module by a string path: that is an import of trainer
    the import-direction check cannot see (an entry point names it instead)."""
    hits = trainer_runs(root, package)
    assert not hits, f"{package}: runs a trainer module with -m: {hits}"


# -- the checks on this tree ---------------------------------------------------------------


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_import_direction(package: str) -> None:
    """journal imports nothing of ours, watcher only journal, trainer both (subpackages
    such as trainer/integrations/ included)."""
    check_import_direction(ROOT, package)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_no_import_cycles_inside_a_package(package: str) -> None:
    """No module of a package imports one that imports it back, at the top, lazily in a
    function or under ``if TYPE_CHECKING:`` (a lazy or type-only import only hides the
    cycle)."""
    check_no_cycles(ROOT, package)


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_layers(package: str) -> None:
    """Each room (subpackage or top-level module) of journal, watcher and trainer imports
    only the rooms below it in its table (JOURNAL_LAYERS, WATCHER_LAYERS, LAYERS), so the
    rooms form no cycle either, and every room has its row."""
    check_layers(ROOT, package, ROOMS[package])


def test_only_the_launcher_imports_the_watcher() -> None:
    """The rank side (and every other part but the launcher) never imports the watcher."""
    bad = sorted(
        str(p.relative_to(ROOT))
        for name, p in _modules(ROOT, "trainer").items()
        if "watcher" in _imports(p) and _room(name) not in MAY_IMPORT_WATCHER
    )
    assert not bad, bad


@pytest.mark.parametrize("package", sorted(MAX_TOP_MODULES))
def test_package_tops_stay_short(package: str) -> None:
    """journal/, watcher/ and trainer/ keep few modules at their tops."""
    check_top_stays_short(ROOT, package)


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_modules_stay_small(package: str) -> None:
    """No module over MAX_MODULE_LINES lines."""
    check_modules_stay_small(ROOT, package)


@pytest.mark.parametrize("package", ["journal", "watcher"])
def test_journal_and_watcher_run_no_trainer_module(package: str) -> None:
    """journal/ and watcher/ name no trainer module to run (``-m trainer.x``): the export
    finds its converter through an entry point."""
    check_runs_no_trainer_module(ROOT, package)


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


# -- each check can fail: a violation planted in a copy of journal/ or watcher/ -------------


def _check_layers(root: Path, package: str) -> None:
    """check_layers with the package's own table."""
    check_layers(root, package, ROOMS[package])


#: Modules whose writes are not a run dir's files: exports into a directory the user names,
#: a checkpoint's own files (beside what torch writes there), a checkpoint's download, a
#: tracker's own directory.
WRITES_ELSEWHERE = (
    "trainer/model/",
    "trainer/checkpoint/",
    "journal/remote/restore.py",
    "watcher/exporters/",
)
_WRITE = re.compile(
    r"\.write_(text|bytes)\(|(?<!def )\bopen\((?!fd\b)[^)]*[\"'][wax]|os\.(open|makedirs|mkfifo)\("
    r"|\.mkdir\(|FileHandler\("
)


def check_writes_go_through_the_helper(root: Path, package: str) -> None:
    """Nothing written inside a run dir goes through a symlink: every file is opened by
    journal.rundir.safety.open_no_follow (atomic_write writes through it), every directory
    made by its safe_dir (make_dir: the run dir itself). A plain open, mkdir or write_*
    anywhere else would follow a link planted there."""
    found = []
    for path in _modules(root, package).values():
        rel = path.relative_to(root).as_posix()
        if rel == "journal/rundir/safety.py" or rel.startswith(WRITES_ELSEWHERE):
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if _WRITE.search(line) and "O_RDONLY" not in line:  # a read is fine
                found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, "writes that could follow a symlink:\n" + "\n".join(found)


CHECKS: dict[str, Callable[[Path, str], None]] = {
    "cycle": check_no_cycles,
    "upward": _check_layers,
    "runs-trainer": check_runs_no_trainer_module,
    "ninth-top-module": check_top_stays_short,
    "plain-write": check_writes_go_through_the_helper,
}

#: (package, violation) -> (the file the plant goes at the end of, the plant, what the
#: check then says). A ninth top-level module: the plant is each new module's text.
PLANTS: dict[tuple[str, str], tuple[str, str, str]] = {
    ("journal", "cycle"): (
        "journal/record/events.py",  # schema imports events: a cycle inside record/
        "def _planted() -> None:\n    from journal.record import schema\n",
        "['journal.record.events', 'journal.record.schema']",
    ),
    ("watcher", "cycle"): (
        "watcher/hooks/callbacks.py",  # hook imports callbacks (and contract, which does too)
        "def _planted() -> None:\n    from watcher.hooks import hook\n",
        "['watcher.hooks.callbacks', 'watcher.hooks.contract', 'watcher.hooks.hook']",
    ),
    ("journal", "upward"): (
        "journal/record/events.py",  # the base room names the CLI's types
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from journal.cli import main\n",
        "journal.record.events -> journal.cli.main",
    ),
    ("watcher", "upward"): (
        "watcher/engine/engine.py",  # the engine runs the scheduler's runner itself
        "def _planted() -> None:\n    from watcher.scheduler.runner import JobRunner\n",
        "watcher.engine.engine -> watcher.scheduler.runner",
    ),
    ("journal", "runs-trainer"): (
        "journal/read/reader.py",
        '_PLANTED = ["python", "-m", "trainer.rank.worker"]\n',
        "'-m', 'trainer.rank.worker'",
    ),
    ("watcher", "runs-trainer"): (
        "watcher/hooks/command.py",
        '_PLANTED = f"{sys.executable} -m trainer.checkpoint.export"\n',
        "-m trainer.checkpoint.export",
    ),
    ("watcher", "plain-write"): (
        "watcher/engine/cursor.py",
        "def _planted(p: Path) -> None:\n    p.write_bytes(b'x')\n",
        "watcher/engine/cursor.py:",
    ),
    ("journal", "ninth-top-module"): ("", '"""Planted."""\n', "journal/: 9 modules at its top"),
    ("watcher", "ninth-top-module"): ("", '"""Planted."""\n', "watcher/: 9 modules at its top"),
}


@pytest.mark.parametrize(("package", "violation"), sorted(PLANTS))
def test_each_check_fails_on_a_planted_violation(
    tmp_path: Path, package: str, violation: str
) -> None:
    """The checks above can fail: each finds its violation planted in a copy of the
    package (read as text and parsed, never imported), and says where it is."""
    shutil.copytree(
        ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
    )
    rel, plant, said = PLANTS[package, violation]
    if violation == "ninth-top-module":
        top = len(list((tmp_path / package).glob("*.py")))
        for i in range(top, MAX_TOP_MODULES[package] + 1):
            (tmp_path / package / f"planted_{i}.py").write_text(plant)
    else:
        path = tmp_path / rel
        path.write_text(f"{path.read_text()}\n\n{plant}")
    with pytest.raises(AssertionError, match=re.escape(said)):
        CHECKS[violation](tmp_path, package)


def test_workers_do_not_load_the_watcher() -> None:
    """A torchrun worker imports the trainer only: no watcher engine in every rank."""
    code = (
        "import sys, trainer.rank.worker\n"
        "bad = sorted(m for m in sys.modules if m == 'watcher' or m.startswith('watcher.'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


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
    assert tuple(RecordModel.model_fields) == ENVELOPE_FIELDS


@pytest.mark.parametrize("package", sorted(OURS))
def test_run_dir_files_are_written_through_the_one_helper(package: str) -> None:
    check_writes_go_through_the_helper(ROOT, package)


def test_only_the_store_builds_a_journal_writer() -> None:
    """One way into a run dir's journal (journal/store.py): the attempt's writer and
    every guest (reports, rotation, the watcher's hand-back, the launcher) go through it, so
    the lock and the position a late record gets are decided in one place."""
    root = Path(__file__).resolve().parents[1]
    allowed = {"journal/write/writer.py", "journal/store.py"}
    builders = []
    for package in ("journal", "watcher", "trainer"):
        for path in _modules(root, package).values():
            rel = str(path.relative_to(root))
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, (ast.Name, ast.Attribute))
                    and (getattr(node.func, "id", None) or getattr(node.func, "attr", None))
                    == "JournalWriter"
                    and rel not in allowed
                ):
                    builders.append(f"{rel}:{node.lineno}")
    assert not builders, f"JournalWriter built outside journal/store.py: {builders}"


def readers_and_writers_imported(root: Path, package: str) -> list[str]:
    """Where ``package`` imports ``journal.read`` or ``journal.write`` (or a module of
    them), lazy imports included."""
    hits = []
    for path in _modules(root, package).values():
        for node in _import_nodes(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                base = node.module or ""
                names = [base, *(f"{base}.{a.name}" for a in node.names)]
            if any(n.split(".")[:2] in (["journal", "read"], ["journal", "write"]) for n in names):
                hits.append(f"{path.relative_to(root)}:{node.lineno}")
    return hits


@pytest.mark.parametrize("package", ["trainer", "watcher"])
def test_the_store_is_the_one_door(package: str, tmp_path: Path) -> None:
    """trainer/ and watcher/ read and write a run's journal through journal/store.py only
    (its cursor, readers, tail and attempt): none imports journal.read or journal.write.
    The check finds such an import planted in a copy of the package."""
    assert not readers_and_writers_imported(ROOT, package), (
        f"{package} imports journal.read or journal.write: "
        f"{readers_and_writers_imported(ROOT, package)}"
    )
    shutil.copytree(
        ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
    )
    planted = tmp_path / package / "__init__.py"
    planted.write_text(
        f"{planted.read_text()}\n\ndef _p() -> None:\n    import journal.read.lines\n"
    )
    assert readers_and_writers_imported(tmp_path, package) == [
        f"{package}/__init__.py:{len(planted.read_text().splitlines())}"
    ]
