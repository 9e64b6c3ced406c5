"""``ilab-journal serve`` end to end in a real browser (chromium via Playwright): a live
2-rank run's page advancing, stopped from the page with the token (the command journaled
with the source ``web``, applied at the next step), nothing written without the token, and
a mirrored run served from the real S3 server. With ``ILAB_SCREENSHOTS=DIR`` the run's page
and its plot are saved there (docs/serve.md's pictures come from here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from tests.browser import serve, story_journal, wait_until
from tests.helpers import cli, kill_tree, records, train_argv, train_env

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
            assert page.locator("#strip .marker.kind-control").count() == 1
            assert page.locator("#strip .marker.kind-evaluate").count() >= 2
            assert page.locator("#strip .marker.kind-save.ck-removed").count() >= 1
            assert page.locator("#strip .marker.kind-save.ck-best").count() == 1
            assert page.locator("tr.ckpt[data-best='true']").count() == 1
            if SCREENSHOTS:
                _screenshots(page, ckpt, Path(SCREENSHOTS))
            page.close()
    finally:
        if job.poll() is None:
            kill_tree(job.pid)


def _screenshots(page: Any, ckpt: Path, out: Path) -> None:
    """The page (top: state, markers, curves; then the checkpoints table) and the plot."""
    out.mkdir(parents=True, exist_ok=True)
    page.locator("#strip .marker.kind-control").hover()
    page.screenshot(
        path=str(out / "serve-run.png"), clip={"x": 0, "y": 0, "width": 1280, "height": 560}
    )
    page.locator("#checkpoints").screenshot(path=str(out / "serve-checkpoints.png"))
    r = cli("ilab-journal", "plot", str(ckpt), "-o", str(out / "plot.png"))
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
