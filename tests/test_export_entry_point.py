"""``ilab-journal export`` finds its converter through the ``ilab_journal.export`` entry
point (pyproject.toml), not by naming a trainer module: journal/ depends on the trainer by no
import and no string."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

from journal.cli.export import EXPORT_GROUP, EXPORTER
from tests.helpers import ROOT, cli, pythonpath, write_run

#: A dotted name of a trainer module inside a string (``"trainer.checkpoint.export"``).
_TRAINER_MODULE = re.compile(r"\btrainer\.[a-z_]+")


def test_the_entry_point_names_the_trainers_exporter() -> None:
    """The installed project declares it (re-install after editing pyproject.toml)."""
    (ep,) = entry_points(group=EXPORT_GROUP, name=EXPORTER)
    assert ep.value == "trainer.checkpoint.export:main"


def test_export_runs_the_exporter_of_the_entry_point(ckpt: Path) -> None:
    """A run without checkpoints: the exporter's own one-line error and exit code come
    through, so the module the entry point names was run."""
    write_run(ckpt, steps=2, save_every=0)
    proc = cli("ilab-journal", "export", str(ckpt), timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"ilab-journal export: {ckpt}: no checkpoint to export in {ckpt / 'checkpoints'}"
    ]


#: ``ilab-journal export DIR`` where no package declares the entry point (a journal-only
#: install): importlib.metadata is made to find none before the CLI is imported.
_NO_EXPORTER = """\
import importlib.metadata as md
import sys

md.entry_points = lambda **kw: md.EntryPoints(())
from journal.cli.main import main

sys.argv = ["ilab-journal", "export", sys.argv[1]]
main()
"""


def test_export_without_an_exporter_installed_is_one_line_exit_2(ckpt: Path) -> None:
    write_run(ckpt, steps=2)
    proc = subprocess.run(
        [sys.executable, "-c", _NO_EXPORTER, str(ckpt)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": pythonpath()},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no exporter is installed" in lines[0], proc.stderr
    assert f"{EXPORT_GROUP}:{EXPORTER}" in lines[0]


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings (a module's, a class's, a function's)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_journal_code_names_no_trainer_module() -> None:
    """No string in journal/'s code (docstrings, read by people, aside) names a trainer
    module: ``python -m trainer...`` by a string is an import edge the layering cannot see."""
    found = []
    for path in sorted((ROOT / "journal").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docs
                and _TRAINER_MODULE.search(node.value)
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert not found, found
