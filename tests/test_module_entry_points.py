"""Modules run by a string path (``python -m trainer....``) still run: a move that breaks a
``-m`` target found anywhere in the code, the Makefile, the docs or CI fails here, not at
run time in a user's launch."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT

#: Every module run with ``-m``, and the arguments that make it print its usage and stop.
TARGETS: dict[str, list[str]] = {
    "trainer.cli": ["--help"],  # ilab-train (bench_gpu.py runs it so without the script)
    "trainer.launch.agent": ["--help"],  # torchrun with a bounded end, run by the launcher
    "trainer.rank.worker": [],  # torchrun's entry on every rank
    "trainer.checkpoint.export": ["--help"],  # ilab-journal export (journal/cli/export.py)
    "trainer.model.convert": ["--help"],  # GGUF -> HF model dir (make demo-llm)
}
_SOURCES = ("trainer", "journal", "watcher", "benchmarks", "examples", "docs", ".ci")
_M_ARG = re.compile(r"""-m\W{0,4}(trainer(?:\.\w+)+)""")


def _named_targets() -> set[str]:
    """The modules the repository runs with ``-m``: ``-m trainer.x`` in text and
    ``"-m", "trainer.x"`` in argument lists."""
    files = [ROOT / "Makefile", ROOT / "README.md"]
    for top in _SOURCES:
        files += [
            p for p in (ROOT / top).rglob("*") if p.is_file() and p.suffix in {".py", ".md", ""}
        ]
    return {m for f in files for m in _M_ARG.findall(f.read_text(errors="replace"))}


def test_every_m_target_is_tested() -> None:
    assert _named_targets() <= set(TARGETS), sorted(_named_targets() - set(TARGETS))


@pytest.mark.parametrize("module", sorted(TARGETS))
def test_m_target_prints_its_usage(module: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", module, *TARGETS[module]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert "usage" in out.lower() or module in out, out[-2000:]
    assert "Traceback" not in out, out[-2000:]
