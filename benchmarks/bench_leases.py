"""Rotation's lease checks: what a save pays to respect leases, with 100 leases present.

Per save, rank 0 lists ``leases/`` once and reads only the leases of the checkpoints it is
about to delete, then, for each deletion, looks once more after renaming it aside. Measured
side by side in one run: the lease check with 0 and with 100 leases present (on other
checkpoints), and a whole ``rotate()`` call that deletes one small checkpoint, with 0 and
100 leases (the difference is what leases cost). Goal: <= 1 ms of lease checks per save
with 100 leases.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit, pct
from journal.checkpoints import leases
from journal.checkpoints.rotation import rotate
from journal.rundir.paths import checkpoints_dir


def _run_dir(root: Path, n_leases: int) -> Path:
    ckpt = root / f"run-{n_leases}"
    for step in range(1, 101):
        (checkpoints_dir(ckpt) / f"step-{step:06d}").mkdir(parents=True)
    for i in range(n_leases):  # on the kept checkpoints, as long evals would hold them
        leases.acquire(ckpt, f"step-{51 + i % 50:06d}", ttl=3600)
    return ckpt


def _time_us(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t) / 1000)
    return out


def check_cost(root: Path, n_leases: int, n: int) -> list[float]:
    """``leased()`` for one deletion candidate, as rotation calls it."""
    ckpt = _run_dir(root, n_leases)
    return _time_us(lambda: leases.leased(ckpt, {"step-000001"}), n)


def rotate_cost(root: Path, n_leases: int, n: int) -> list[float]:
    """A whole rotation that deletes one (small) surplus checkpoint per call: the newest 100
    are kept, an older one appears before each call (as a save makes one surplus)."""
    ckpt = _run_dir(root, n_leases)
    times = []
    for _ in range(n):
        (checkpoints_dir(ckpt) / "step-000000").mkdir()
        t = time.perf_counter_ns()
        removed = rotate(ckpt, 100, keep=set(), emit=lambda ev, data: None)
        times.append((time.perf_counter_ns() - t) / 1000)
        assert [p.name for p in removed] == ["step-000000"], removed
    return times


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    n = 300 if args.quick else 3000
    result: dict[str, Any] = {"leases_present": 100, "samples": n}
    with tempfile.TemporaryDirectory(prefix="bench-leases-") as d:
        root = Path(d)
        c0, c100 = check_cost(root, 0, n), check_cost(root, 100, n)
        r0, r100 = rotate_cost(root / "r", 0, n), rotate_cost(root / "r", 100, n)
    result.update(
        check_us_p50_0_leases=pct(c0, 50),
        check_us_p50_100_leases=pct(c100, 50),
        check_us_p99_100_leases=pct(c100, 99),
        rotate_us_p50_0_leases=pct(r0, 50),
        rotate_us_p50_100_leases=pct(r100, 50),
        rotate_us_p99_100_leases=pct(r100, 99),
        rotate_100_vs_0=pct(r100, 50) / pct(r0, 50),
        # what leases add to a save that deletes one checkpoint: the look before and the
        # look after renaming it aside
        lease_cost_us_per_save_p50=pct(r100, 50) - pct(r0, 50),
        lease_checks_us_per_save_p99=2 * pct(c100, 99),
        goal_us_per_save=1000.0,
        goal_met=2 * pct(c100, 99) <= 1000.0,
    )
    emit("bench_leases", result, args.json)


if __name__ == "__main__":
    main()
