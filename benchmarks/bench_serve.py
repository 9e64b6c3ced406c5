"""``ilab-journal serve`` in a real browser (chromium via Playwright), a small and a large
journal side by side in one run: the server's start (it folds a named run before it
listens), the page's first paint, the server's memory (RSS, large minus small: what the
large journal costs), a record appended -> shown in the open page (p50/p95), and the runs
list of a parent dir of 100 runs. Targets (issue 45): first paint <= 2 s, extra memory
<= 150 MB, append -> page <= 1 s p50, runs list <= 1 s."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from benchmarks.common import bench_parser, emit, write_step_journal
from journal import JournalWriter
from tests.browser import BrowserUnavailable, launch, story_journal
from tests.helpers import BIN, log_payload


def moving_log(s: int, steps: int) -> dict[str, Any]:
    """A ``log`` payload whose numbers move as a real run's do, for
    :func:`benchmarks.common.write_step_journal`: each of the 6 curves is a chart (a
    constant curve is one line of the page's constant row: its first paint draws less)."""
    wave = math.sin(s / 37)
    data = log_payload(s, 0.5 + 5 / (1 + s / 500) + 0.05 * wave)
    data.update(
        lr=1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * s / steps)),
        grad_norm=1 + 0.5 * wave,
        elapsed_time=0.25 + 0.01 * wave,
        tokens_per_s=4096.0 + 100 * wave,
        samples_per_s=32.0 + wave,
    )
    return data


def start(*args: str) -> tuple[subprocess.Popen[str], str, float]:
    """``ilab-journal serve ARGS --port 0``: the process, its address, seconds to listen."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [str(BIN / "ilab-journal"), "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    url = next(w for w in line.split() if w.startswith("http://"))
    return proc, url, time.perf_counter() - t


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def rss_mb(proc: subprocess.Popen[str]) -> float:
    return psutil.Process(proc.pid).memory_info().rss / 2**20


def first_paint(browser: Any, url: str, repeats: int) -> tuple[float, float]:
    """Median seconds to the page's state, markers and curves drawn: (as Playwright sees it
    from ``goto``, in the page from its navigation start)."""
    wall, inside = [], []
    for _ in range(repeats):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("body[data-painted='1']", timeout=60_000)
        wall.append(time.perf_counter() - t)
        inside.append(page.evaluate("window.ilabPaintMs") / 1000)
        charts = page.locator(".chart").count()
        assert charts == 6, f"{charts} charts drawn, not 6"  # the same work as before
        page.close()
    return statistics.median(wall), statistics.median(inside)


def append_latency(browser: Any, url: str, ckpt: Path, first_step: int, n: int) -> list[float]:
    """Seconds from a ``log`` record appended (the writer's append returned) to its step
    shown in the open page, ``n`` times."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector("body[data-painted='1']", timeout=60_000)
    out = []
    with JournalWriter(ckpt, resume=True) as w:
        for i in range(n):
            step = first_step + i
            w.append("log", log_payload(step), step=step)
            t = time.perf_counter()
            page.wait_for_function(
                "(s) => document.getElementById('step').textContent === s",
                arg=str(step),
                polling="raf",
                timeout=10_000,
            )
            out.append(time.perf_counter() - t)
            page.wait_for_timeout(137)  # appends land at a varying phase of the page's poll
    page.close()
    return out


def runs_list(browser: Any, url: str, runs: int, repeats: int) -> tuple[float, float]:
    """Median seconds from navigating to the runs list to all ``runs`` rows shown: (as
    Playwright sees it from ``goto``, in the page from its navigation start)."""
    wall, inside = [], []
    for _ in range(repeats):
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_selector(f"#runs[data-loaded='{runs}']", timeout=60_000)
        wall.append(time.perf_counter() - t)
        inside.append(page.evaluate("window.ilabPaintMs") / 1000)
        page.close()
    return statistics.median(wall), statistics.median(inside)


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    big_steps = 40_000 if args.quick else 200_000  # 5 records a step: 200k / 1M records
    repeats, appends, parent_runs = (2, 10, 30) if args.quick else (3, 30, 100)
    result: dict[str, Any] = {}
    try:
        browser_cm = launch()
        browser = browser_cm.__enter__()
    except BrowserUnavailable as exc:
        emit("bench_serve", {"skipped": str(exc)}, args.json)
        return
    try:
        with tempfile.TemporaryDirectory(prefix="bench-serve-") as d:
            small, big, parent = Path(d) / "small", Path(d) / "big", Path(d) / "runs"
            write_step_journal(small, 200, moving_log)
            write_step_journal(big, big_steps, moving_log)
            for i in range(parent_runs):
                story_journal(parent / f"run-{i:03d}", steps=40)
            result["big_records"] = big_steps * 5
            for name, ckpt, steps in (("small", small, 200), ("big", big, big_steps)):
                proc, url, listen_s = start(str(ckpt))
                try:
                    result[f"{name}_start_s"] = listen_s
                    wall, inside = first_paint(browser, url + f"run/{name}", repeats)
                    result[f"{name}_first_paint_s"] = wall
                    result[f"{name}_first_paint_in_page_s"] = inside
                    result[f"{name}_rss_mb"] = rss_mb(proc)
                    lat = append_latency(browser, url + f"run/{name}", ckpt, steps + 1, appends)
                    result[f"{name}_append_p50_s"] = statistics.median(lat)
                    result[f"{name}_append_p95_s"] = sorted(lat)[int(0.95 * (len(lat) - 1))]
                    result[f"{name}_rss_after_appends_mb"] = rss_mb(proc)
                finally:
                    stop(proc)
            result["big_extra_rss_mb"] = result["big_rss_after_appends_mb"] - result["small_rss_mb"]
            result["first_paint_ratio_big_small"] = (
                result["big_first_paint_s"] / result["small_first_paint_s"]
            )
            proc, url, listen_s = start(str(parent))
            try:
                result["runs_list_runs"] = parent_runs
                result["runs_list_start_s"] = listen_s
                wall, inside = runs_list(browser, url, parent_runs, repeats)
                result["runs_list_s"], result["runs_list_in_page_s"] = wall, inside
            finally:
                stop(proc)
    finally:
        browser_cm.__exit__(None, None, None)
    result["targets_met"] = {
        "first_paint_le_2s": result["big_first_paint_s"] <= 2.0,
        "extra_memory_le_150mb": result["big_extra_rss_mb"] <= 150.0,
        "append_p50_le_1s": result["big_append_p50_s"] <= 1.0,
        "runs_list_le_1s": result["runs_list_s"] <= 1.0,
    }
    emit("bench_serve", result, args.json)


if __name__ == "__main__":
    main()
