"""How long ``ilab-journal status`` takes to start and answer, beside the floor every Python
CLI pays: ``python -c 'import click, orjson'`` (the interpreter, click and orjson). Measured
as pairs in one run, one after the other, so a busy machine slows both alike; the median
of each and their ratio are printed (issue "One truth of a run", point 9: at most 1.5x).

The run answered is a finished 10-step run with an index (the common case in scripts).

Both commands run with their bytecode cached, as an installed package has it: the first,
untimed, run of each writes the ``.pyc`` files, so ``PYTHONDONTWRITEBYTECODE`` is dropped
from their environment (set, every run would compile each module edited since the last
cache write: milliseconds of ``status`` in a working tree)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit

BIN = Path(sys.executable).parent
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def _timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, capture_output=True, check=False, env=ENV)
    return time.perf_counter() - t0


def main() -> None:
    ap = bench_parser(__doc__)
    ap.add_argument("--pairs", type=int, default=40, help="pairs measured (default 40)")
    args = ap.parse_args()
    pairs = 10 if args.quick else args.pairs
    from tests.helpers import write_run  # a schema-valid run, as the tests write it

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        run.mkdir()
        write_run(run)
        floor_cmd = [sys.executable, "-c", "import click, orjson"]
        status_cmd = [str(BIN / "ilab-journal"), "status", str(run)]
        for cmd in (floor_cmd, status_cmd):  # warm the page cache and write the .pyc files
            _timed(cmd)
        floor, status = [], []
        for _ in range(pairs):
            floor.append(_timed(floor_cmd))
            status.append(_timed(status_cmd))
    f, s = statistics.median(floor), statistics.median(status)
    ratios = sorted(b / a for a, b in zip(floor, status, strict=True))
    emit(
        "bench_startup",
        {
            "pairs": pairs,
            "import_click_orjson_ms": f * 1e3,
            "status_ms": s * 1e3,
            "ratio_of_medians": s / f,
            "ratio_p25": ratios[len(ratios) // 4],
            "ratio_p75": ratios[3 * len(ratios) // 4],
        },
        args.json,
    )


if __name__ == "__main__":
    main()
