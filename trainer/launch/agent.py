"""The torchrun agent as ``ilab-train`` starts it: torchrun, with an end bounded in time.

When the launcher dies (``kill -9``, the OOM killer), the agent gets SIGTERM from the kernel
(parent-death signal); torchrun's handler raises an exception in its main thread, stops the
workers and exits. That exception can land anywhere, and at a bad moment it leaves torchrun
unable to reap its workers (seen in CI: inside ``Popen.poll`` between taking and releasing
its waitpid lock, after which every wait of torchrun's times out): the agent then lingers
beside the relaunch with its dead workers. Here a thread watches the launcher; once it is
gone and the workers have ended (they watch the launcher too, and leave within
``ORPHAN_GRACE_S``), the agent gets ``AGENT_EXIT_S`` to leave by itself, then it is ended.

Only the agent learns how each worker ended (torchrun reaps them): when they failed, it
writes torchrun's first observed failure (its rank, pid, exit code or signal) to the file
``FIRST_FAILURE_ENV`` names, which the launcher journals (trainer/launch/recovery.py).

Run as ``python -m trainer.launch.agent <torchrun arguments>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from journal.rundir.files import atomic_write
from journal.rundir.procs import ORPHAN_GRACE_S, running_children, watch_parent

AGENT_EXIT_S = 5.0  # torchrun's own shutdown, once its workers have ended
_POLL_S = 0.2
FIRST_FAILURE_ENV = "ILAB_FIRST_FAILURE_FILE"


def end_when_orphaned(grace_s: float = ORPHAN_GRACE_S + AGENT_EXIT_S) -> None:
    """Called once the launcher is gone: wait (at most ``grace_s``) for the workers to end,
    give the agent ``AGENT_EXIT_S`` to exit by itself, then kill what is left and exit."""
    deadline = time.monotonic() + grace_s
    while running_children() and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    time.sleep(AGENT_EXIT_S)
    for pid in running_children():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    os._exit(128 + signal.SIGTERM)


def main(run: Callable[[], object] | None = None) -> NoReturn:
    """Run torchrun (or ``run``) with the bounded end installed; exit 1 when it raised."""
    watch_parent(end_when_orphaned)
    if run is None:
        from torch.distributed.run import main as torchrun

        run = torchrun
    code = 0
    try:
        run()
    except Exception as exc:
        if hasattr(exc, "get_first_failure"):  # torchrun's ChildFailedError: workers failed
            _write_first_failure(exc)
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no interpreter teardown: collecting torch's objects takes seconds


def _write_first_failure(exc: Any) -> None:
    """torchrun's first observed failure into the launcher's file (none named: nothing)."""
    path = os.environ.get(FIRST_FAILURE_ENV)
    if not path:
        return
    rank, failure = exc.get_first_failure()
    signal_name = failure.signal_name() if failure.exitcode < 0 else None
    data = {"rank": rank, "pid": failure.pid, "exitcode": failure.exitcode, "signal": signal_name}
    with contextlib.suppress(OSError):  # the launcher then says what it knows without it
        atomic_write(path, json.dumps(data).encode(), root=Path(path).parent, durable=False)


if __name__ == "__main__":
    main()
