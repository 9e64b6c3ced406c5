"""``ilab-journal serve`` end to end in a real browser (chromium via Playwright): a live
2-rank run's page advancing, stopped from the page with the token (the command journaled
with the source ``web``, applied at the next step), nothing written without the token, and
a mirrored run served from the real S3 server; a run like ``make demo``'s on its page at 1400
and 420 px. With ``ILAB_SCREENSHOTS=DIR`` that run's page and its plot are saved there
(docs/serve.md's pictures come from here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from tests.browser import page_width, serve, story_journal, wait_until
from tests.helpers import ROOT, cli, kill_tree, records, train_argv, train_env

pytestmark = [pytest.mark.extended, pytest.mark.dist]

SCREENSHOTS = os.environ.get("ILAB_SCREENSHOTS")


def _open(browser: Any, url: str) -> Any:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(url)
    page.wait_for_selector("body[data-painted='1']")
    return page


def test_a_live_run_is_stopped_from_its_page_with_the_token(tmp_path: Path, browser: Any) -> None:
    ckpt = tmp_path / "run"
    argv = train_argv(
        ckpt,
        "--max-steps",
        "400",
        "--save-every",
        "10",
        "--eval-every",
        "10",
        "--log-every",
        "5",
        "--keep-last-n",
        "1",
        "--keep-best",
        "val_loss:min",
    )
    job = subprocess.Popen(
        argv,
        env=train_env(step_delay=0.1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: any(r["event"] == "save" for r in records(ckpt)), 240, "a first save")
        with serve(str(ckpt), "--allow-control") as s:
            assert s.token
            # without the token: the button is refused and nothing is written
            bare = _open(browser, s.url + "run/run")
            step = int(bare.text_content("#step") or 0)
            wait_until(lambda: int(bare.text_content("#step") or 0) > step, 30, "live steps")
            bare.fill("#control-reason", "no token")
            bare.click("#control-stop")
            wait_until(
                lambda: "refused" in (bare.text_content("#control-said") or ""), 10, "refusal"
            )
            assert not list((ckpt / "control").glob("*.json"))
            bare.close()
            # with the token (the printed address): stop, applied at the next step
            page = _open(browser, f"{s.url}run/run?token={s.token}")
            assert "token" not in page.url  # taken out of the address bar
            wait_until(lambda: page.locator("#strip .marker.kind-save").count() >= 2, 60, "saves")
            page.fill("#control-reason", "enough from the page")
            page.click("#control-stop")
            wait_until(lambda: "sent" in (page.text_content("#control-said") or ""), 10, "sent")
            assert job.wait(timeout=120) == 0, job.stderr.read() if job.stderr else ""
            wait_until(
                lambda: page.get_attribute("#facts", "data-state") == "stopped",
                10,
                "the page showing the stop",
            )
            recs = records(ckpt)
            stop = next(r for r in recs if r["event"] == "control")["data"]
            assert (stop["command"], stop["accepted"]) == ("stop", True)
            assert stop["source"] == "web:127.0.0.1" and stop["reason"] == "enough from the page"
            end = (
                recs[-1]
                if recs[-1]["event"] == "train_end"
                else next(r for r in recs if r["event"] == "train_end")
            )
            assert end["data"]["status"] == "stopped" and end["step"] == stop["applied_at_step"]
            wait_until(lambda: page.locator("#strip .marker.kind-end").count() == 1, 10, "end")
            # the verdict where "sent" was, and the buttons off once the run has ended
            said = page.text_content("#control-said") or ""
            assert f"stop applied at step {stop['applied_at_step']}" in said, said
            assert "the run has ended (stopped" in said and not page.is_enabled("#control-stop")
            assert page.locator("#strip .marker.kind-control").count() == 1
            assert page.locator("#strip .marker.kind-evaluate").count() >= 2
            assert page.locator("#strip .marker.kind-save.ck-removed").count() >= 1
            assert page.locator("#strip .marker.kind-save.ck-best").count() == 1
            assert page.locator("tr.ckpt[data-best='true']").count() == 1
            page.close()
    finally:
        if job.poll() is None:
            kill_tree(job.pid)


def test_a_demo_run_s_page_at_1400_and_420_px(tmp_path: Path, browser: Any) -> None:
    """A run as ``make demo`` makes it (examples/demo.py: 2 ranks, an eval of each save
    asking for a stop at 0.8 accuracy), on its page 1400 and 420 px wide: nothing wider
    than the window, the stop and the best marked, every mark in its legend entry's colour,
    the eval's constant ``report:eval_problems`` in the constant row, not a chart of its
    own. With ``ILAB_SCREENSHOTS=DIR`` docs/serve.md's pictures are taken from it."""
    run = tmp_path / "demo"
    demo = subprocess.run(
        [sys.executable, str(ROOT / "examples/demo.py"), "--run-dir", str(run)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    stopped = any(r["event"] == "control" for r in records(run))
    with serve(str(run)) as s:
        for width in (1400, 420):
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(s.url + "run/demo")
            page.wait_for_selector("body[data-tables='1']")
            assert page_width(page) <= width
            state = page.text_content("#facts .state")
            assert state == ("stopped" if stopped else "completed")
            assert page.locator("#strip .marker.kind-control").count() == int(stopped)
            assert page.locator("#strip .marker.ck-best").count() == 1
            assert page.locator("#constant button[data-name='report:eval_problems']").count() == 1
            assert page.locator(".chart[data-metric='report:eval_problems']").count() == 0
            order = page.eval_on_selector_all(".chart", "cs => cs.map((c) => c.dataset.metric)")
            assert order[:3] == ["loss", "report:accuracy", "lr"], order
            drawn = page.eval_on_selector_all(
                "#strip .marker", "ms => ms.map((m) => m.dataset.look)"
            )
            legend = page.eval_on_selector_all(
                "#legend .legend-item", "ls => ls.map((i) => i.dataset.look)"
            )
            assert set(drawn) == set(legend)
            if SCREENSHOTS:
                _screenshots(page, run, Path(SCREENSHOTS), width)
            page.close()


def _screenshots(page: Any, run: Path, out: Path, width: int) -> None:
    """At 1400 px: the page's top (state, legend, markers, curves; a stop hovered), the
    checkpoints table and the plot; at 420 px: the page's top and the checkpoints table."""
    out.mkdir(parents=True, exist_ok=True)
    if width < 1000:
        page.screenshot(path=str(out / "serve-narrow.png"))
        table = page.locator("#checkpoints").locator("xpath=../..")  # with its note, if any
        table.scroll_into_view_if_needed()
        table.screenshot(path=str(out / "serve-narrow-table.png"))
        return
    if page.locator("#strip .marker.kind-control").count():
        page.locator("#strip .marker.kind-control").hover()
    page.screenshot(path=str(out / "serve-run.png"))
    page.mouse.move(0, 0)
    page.locator("#checkpoints").evaluate("t => t.parentElement.scrollIntoView()")
    page.locator("#checkpoints").screenshot(path=str(out / "serve-checkpoints.png"))
    r = cli("ilab-journal", "plot", str(run), "-o", str(out / "plot.png"))
    assert r.returncode == 0, r.stderr


def test_a_mirrored_run_is_served_from_the_store(tmp_path: Path, s3: Any, browser: Any) -> None:
    ckpt = tmp_path / "run"
    story_journal(ckpt)
    uri = s3.fresh_uri() + "/served"
    r = cli("ilab-watch", str(ckpt), "--mirror", uri, "--replay", timeout=120)
    assert r.returncode == 0, r.stderr
    with serve(uri) as s:
        page = _open(browser, s.url)
        wait_until(lambda: page.locator("tr.run").count() == 1, 10, "the runs list")
        assert page.get_attribute("tr.run", "data-key") == "served"
        page.click("tr.run a")
        page.wait_for_selector("body[data-painted='1']")
        assert page.text_content("#facts .state") == "stopped"
        assert page.locator("#strip .marker.kind-save").count() == 3
        page.close()
