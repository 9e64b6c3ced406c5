"""Debian packages the test fixtures need (Slurm's daemons, chromium), installed with apt
where they are missing and this process can: root, with ``apt-get`` (what ``.ci/run`` does
in shell). The fixtures skip with the reason :func:`apt_install` gives where it cannot."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

#: One install at a time among the suite's processes (pytest-xdist workers start their
#: session fixtures together); apt's own locks would fail the second, not wait for it.
_LOCK = Path(tempfile.gettempdir()) / "ilab-tests-apt.lock"
INSTALL_TIMEOUT_S = 900.0


def apt_install(packages: list[str], present: Callable[[], bool]) -> str | None:
    """Make ``present()`` true by installing ``packages`` with apt-get where it is false:
    an install first (the package lists may do), then ``apt-get update`` and the install
    again. None once ``present()`` holds; otherwise why not, in one line."""
    if present():
        return None
    names = " ".join(packages)
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"not root: cannot apt-get install {names}"
    if shutil.which("apt-get") is None:
        return f"no apt-get to install {names} with"
    install = ["apt-get", "install", "-y", "-q", *packages]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}  # no debconf question waits
    last = ""
    with open(_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        for argv in (install, ["apt-get", "update", "-q"], install):
            if present():  # another process installed it while this one waited
                return None
            try:
                done = subprocess.run(
                    argv, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, env=env
                )
            except (subprocess.SubprocessError, OSError) as exc:
                last = str(exc)
                continue
            if done.returncode != 0:
                lines = [ln.strip() for ln in done.stderr.splitlines() if ln.strip()]
                last = lines[-1] if lines else f"exit code {done.returncode}"
        if present():
            return None
    return f"apt-get install {names} failed: {last or 'still missing after it'}"
