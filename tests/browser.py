"""A real browser and a real ``ilab-journal serve`` for the serve tests and bench_serve.py.

The browser is Debian's ``chromium`` (apt) driven by Playwright for Python with
``executable_path`` (Playwright's own browser download needs the internet). Where chromium
is missing, :func:`ensure_chromium` installs it with apt when it can (tests/apt.py, as
tests/slurm_cluster.py does Slurm's); where it still cannot start, :func:`launch` raises
:class:`BrowserUnavailable` with the reason and the fixtures skip.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from journal.write.writer import JournalWriter
from tests.apt import apt_install
from tests.helpers import BIN, begin_payload, log_payload

CHROMIUM = os.environ.get("ILAB_CHROMIUM", "/usr/bin/chromium")
#: Strings a hostile journal carries where the page shows text: each would run script (and
#: set ``window.__pwned``) if the page ever parsed record text as HTML.
HOSTILE_SCRIPT = "<script>window.__pwned=1</script>"
HOSTILE_IMG = '<img src=x onerror="window.__pwned=1;alert(1)">'


class BrowserUnavailable(RuntimeError):
    """No browser here: the message says why."""


def ensure_chromium() -> str:
    """The chromium executable, installed with apt first where missing and possible."""
    if why := apt_install(["chromium"], Path(CHROMIUM).exists):
        raise BrowserUnavailable(f"no chromium at {CHROMIUM}: {why}")
    return CHROMIUM


@contextlib.contextmanager
def launch() -> Iterator[Any]:
    """A headless chromium browser (Playwright's Browser)."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        raise BrowserUnavailable("playwright is not installed (pip install playwright)") from None
    exe = ensure_chromium()
    with sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        except Error as exc:
            raise BrowserUnavailable(
                f"chromium does not start: {str(exc).splitlines()[0]}"
            ) from None
        try:
            yield browser
        finally:
            browser.close()


@dataclass
class Served:
    """A running ``ilab-journal serve``: its address (without the token) and the token."""

    proc: subprocess.Popen[str]
    url: str
    token: str | None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def serve(*args: str, timeout: float = 60) -> Iterator[Served]:
    """``ilab-journal serve ARGS --port 0`` until the block ends; waits for its address."""
    proc = subprocess.Popen(
        [str(BIN / "ilab-journal"), "serve", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the server prints its address once it listens
        if not line:
            raise AssertionError(f"serve exited: {proc.wait(timeout)} {proc.stderr.read()}")  # type: ignore[union-attr]
        address = next(w for w in line.split() if w.startswith("http://"))
        url, _, token = address.partition("?token=")
        yield Served(proc, url, token or None)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def story_journal(
    ckpt: Path, *, hostile: bool = False, steps: int = 60, end: bool = True
) -> JournalWriter:
    """A journal with the whole story written by the real writer: logs every step, evals and
    saves every 20 steps, a report per save (one metric), the first save removed by
    rotation, a lease on the last one, a scheduler job, a stop command applied and
    ``train_end`` stopped. ``hostile``: callback names, reasons and a metric name are HTML
    that would run script if parsed. The writer is returned open when not ``end``."""
    bad = f" {HOSTILE_SCRIPT}{HOSTILE_IMG}" if hostile else ""
    metric = f"accuracy{HOSTILE_IMG}" if hostile else "accuracy"
    w = JournalWriter(ckpt)
    w.append("train_begin", {**begin_payload(steps), "config": {"keep_best": f"{metric}:max"}})
    for s in range(1, steps + 1):
        w.append("log", log_payload(s, 3.0 / s), step=s, samples_seen=s * 8)
        if s % 20 == 0:
            w.append("evaluate", {"val_loss": 3.2 / s, "duration": 0.1}, step=s)
            path = str(ckpt / f"checkpoints/step-{s:06d}")
            (ckpt / "checkpoints" / f"step-{s:06d}").mkdir(parents=True, exist_ok=True)
            w.append(
                "save",
                {
                    "checkpoint_path": path,
                    "kind": ["full_state"],
                    "duration": 0.1,
                    "trigger": "interval",
                },
                step=s,
            )
            w.append(
                "report",
                {
                    "checkpoint_path": path,
                    "step": s,
                    "metrics": {metric: s / 100.0},
                    "source": f"watcher:eval-accuracy{bad}",
                },
                step=s,
            )
            w.append(
                "job",
                {
                    "job_id": f"{1000 + s}",
                    "scheduler": "slurm",
                    "state": "COMPLETED",
                    "node": "node1",
                    "exit_code": 0,
                    "checkpoint_path": path,
                    "step": s,
                    "delivery_id": f"d{s}",
                    "hook": f"save-eval{bad}",
                    "attempt": 1,
                    "source": None,
                },
                step=s,
            )
        if s == 40:
            first = ckpt / "checkpoints/step-000020"
            first.rmdir()
            w.append(
                "checkpoint_removed",
                {"checkpoint_path": str(first), "reason": f"rotation: keep_last_n=1{bad}"},
                step=s,
            )
    if end:
        w.append(
            "control",
            {
                "command": "stop",
                "id": "c1",
                "source": f"eval.py{bad}",
                "accepted": True,
                "reason": f"target reached{bad}",
                "applied_at_step": steps,
            },
            step=steps,
        )
        w.append(
            "train_end",
            {
                "status": "stopped",
                "reason": f"stop command: target{bad}",
                "final_checkpoint": None,
                "best_checkpoint": {
                    "checkpoint_path": str(ckpt / f"checkpoints/step-{steps:06d}"),
                    "metric": metric,
                    "value": steps / 100.0,
                    "step": steps,
                },
            },
            step=steps,
        )
        w.close()
    return w


def curve_journal(ckpt: Path, *, steps: int, end: bool = True) -> None:
    """A run whose numbers move as a real run's do: the loss falling from 6 with some
    noise, lr warming up then decaying on a cosine from 1e-3 (down to about 1e-4, where
    a 3-digit readout must not say 0), grad_norm and throughput varying; an evaluation and
    a save every ``steps // 10`` steps."""
    every = max(1, steps // 10)
    with JournalWriter(ckpt) as w:
        w.append("train_begin", begin_payload(steps))
        for s in range(1, steps + 1):
            warm = min(1.0, s / (steps * 0.05))
            lr = 1e-4 + 0.9e-3 * warm * 0.5 * (1 + math.cos(math.pi * s / steps))
            loss = 0.5 + 5.5 * math.exp(-s / (steps / 8)) + 0.05 * math.sin(s * 1.7)
            data = {**log_payload(s, loss), "lr": lr, "grad_norm": 1 + 0.5 * math.sin(s / 9)}
            data["tokens_per_s"] = 4000.0 + 300 * math.sin(s / 40)
            w.append("log", data, step=s)
            if s % every == 0:
                w.append("evaluate", {"val_loss": loss * 1.1, "duration": 0.1}, step=s)
                (ckpt / f"checkpoints/step-{s:06d}").mkdir(parents=True)
                path = str(ckpt / f"checkpoints/step-{s:06d}")
                w.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=s)
        if end:
            w.append("train_end", {"status": "completed", "reason": None}, step=steps)


def page_width(page: Any) -> int:
    """How wide the page lays out (wider than the window: it scrolls sideways)."""
    return int(
        page.evaluate("Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)")
    )


def wait_until(pred: Any, timeout: float, what: str) -> Any:
    """Poll ``pred`` until truthy (returned) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := pred():
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
