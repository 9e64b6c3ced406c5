"""Full scans of a large journal on several cores: the file is cut at line starts into byte
ranges, each scanned by a process of its own, and the callers merge the parts in file order.

Used by ``ilab-journal validate`` and ``stats``: a 5M-record journal (1 GB) is read at the
speed of the cores the machine gives, in bounded memory per process.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from journal.read.lines import next_line_start, open_for_reading

T = TypeVar("T")

MAX_JOBS = 4  # processes that scan parts of a large journal at once
BYTES_PER_JOB = 16 << 20  # no extra process for less than this
SCAN_BYTES = 1 << 20  # a full scan's batch: ~5k records (and their copies) in memory at a time


def default_jobs(size: int) -> int:
    """Processes for scanning ``size`` bytes: one per core, at most 4, one per 16 MB."""
    return min(_cores(), MAX_JOBS, max(1, size // BYTES_PER_JOB))


def map_ranges(scan: Callable[[Path, int, int | None], T], path: Path, jobs: int | None) -> list[T]:
    """``scan(path, start, end)`` for each byte range of the file, in file order: ``end`` is
    the next range's start, None for the last (read to the end of the file, whatever was
    appended meanwhile). One range, in this process, when ``jobs`` (default
    :func:`default_jobs`) is 1 or the file is small; otherwise ``scan`` must be a module-level
    function (it runs in other processes)."""
    size = path.stat().st_size if path.exists() else 0
    starts = line_starts(path, size, default_jobs(size) if jobs is None else jobs)
    if len(starts) == 1:
        return [scan(path, 0, None)]
    ends: list[int | None] = [*starts[1:], None]
    # fork shares what this process has built (imports, schemas) at no cost; it is safe
    # only where no other thread may hold a lock at the time
    alone = sys.platform == "linux" and threading.active_count() == 1
    ctx = multiprocessing.get_context("fork" if alone else "spawn")
    with ProcessPoolExecutor(len(starts), mp_context=ctx) as pool:
        return list(pool.map(scan, [path] * len(starts), starts, ends))


def line_starts(path: Path, size: int, jobs: int) -> list[int]:
    """Up to ``jobs`` offsets that start lines, the first 0: where the range scans begin."""
    starts = [0]
    if jobs <= 1:
        return starts
    fd = open_for_reading(path)
    try:
        for k in range(1, jobs):
            # just past the next newline, found in bounded memory (a line may be huge)
            pos = next_line_start(fd, max(k * size // jobs - 1, starts[-1]), size)
            if starts[-1] < pos < size:
                starts.append(pos)
    finally:
        os.close(fd)
    return starts


def _cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS tells)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
