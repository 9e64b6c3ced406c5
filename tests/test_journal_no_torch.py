"""journal/ is the contract for scripts and other tools: it must never import torch."""

import subprocess
import sys


def test_journal_package_and_cli_do_not_import_torch() -> None:
    code = (
        "import sys, journal, journal.cli.main, journal.record.schema, journal.views.summary, journal.cli.tail, "
        "journal.views.query, journal.channels.control\n"
        "bad = [m for m in ('torch', 'accelerate') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
