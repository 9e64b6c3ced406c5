"""Ctrl-C twice at ``ilab-train``: one line, exit 130, no traceback text on the console."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

from tests.helpers import BIN, kill_tree, records, train_env, wait_for
from trainer.launch.console import ConsoleFilter

#: torchrun's agent, signalled again while it stops its workers (the launch log keeps it).
_CHAINED_TRACEBACK = """Traceback (most recent call last):
  File ".../torch/distributed/elastic/agent/server/api.py", line 745, in run
    result = self._invoke_run(role)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 17794 got signal: 2

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
    time.sleep(delay)
torch.distributed.elastic.multiprocessing.api.SignalException: Process 17794 got signal: 2
[rank0] training interrupted: SIGINT at step 1
"""


def test_a_chained_traceback_leaves_nothing_on_the_console() -> None:
    console = ConsoleFilter()
    shown = [ln for ln in _CHAINED_TRACEBACK.splitlines(keepends=True) if console.show(ln)]
    assert shown == ["[rank0] training interrupted: SIGINT at step 1\n"]


def test_ctrl_c_twice_prints_one_line_and_exits_130(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    argv = [str(BIN / "ilab-train"), "--demo", "--ckpt-dir", str(ckpt), "--nproc-per-node", "1"]
    job = subprocess.Popen(
        [*argv, "--max-steps", "50"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=train_env(step_delay=1.0),  # the first Ctrl-C's step is still running at the second
        start_new_session=True,  # a terminal's Ctrl-C: SIGINT to the whole foreground group
    )
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(job.stdout or []), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: any(r["event"] == "train_begin" for r in records(ckpt)), what="train_begin"
        )
        os.killpg(job.pid, signal.SIGINT)
        wait_for(lambda: any("SIGINT received" in ln for ln in out), what="the first's line")
        os.killpg(job.pid, signal.SIGINT)
        rc = job.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        kill_tree(job.pid)
    console = "".join(out)
    assert rc == 130, console
    assert console.count("interrupted again: stopping now") == 1, console
    assert "Traceback" not in console and "During handling" not in console, console
    assert "\n\n" not in console, console  # no stray blank line where a traceback was
    assert records(ckpt)[-1]["event"] == "train_end"  # status and watchers see the end
