"""The page of ``ilab-journal serve`` in a real browser (chromium via Playwright, see
tests/browser.py), as a person uses it: a drag zooms every chart and fetches that range at
full resolution; the log and smoothing controls change what is drawn; numbers read in
3 significant digits and ticks never repeat; in compare one run keeps one colour on every
chart; the legend shows every marker drawn in its colour, the best on top; no page is wider
than a 420 px window (a table that scrolls says so); a run started after the page opened
appears, and a released lease and an ended run's controls change in an open page. At a
glance (one server): no run colour is a marker's, compare's lines are their run's; alerted,
hung and diverged runs are marked, a hung one has no ETA; an alert's row says who was told
when; a filter matching nothing says so; a short curve is not smoothed; values near the
float's limit are drawn. Every wait polls with a deadline."""

from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")

from journal.checkpoints.leases import acquire, release
from journal.store import guest
from journal.write.writer import JournalWriter
from tests.browser import Served, curve_journal, page_width, serve, story_journal, wait_until
from tests.helpers import begin_payload, log_payload

#: ``ILAB_SCREENSHOTS=DIR``: the runs list and compare of the at-a-glance runs are saved
#: there (docs/serve.md's serve-runs.png and serve-compare.png).
SCREENSHOTS = os.environ.get("ILAB_SCREENSHOTS")
#: A readable time (the machine's local time to the second), where 1.8e9 was shown.
READABLE_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


def _open(browser: Any, url: str, width: int = 1400) -> Any:
    page = browser.new_page(viewport={"width": width, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    page.goto(url)
    page.wait_for_selector("body[data-painted='1']")
    return page


def _charts(page: Any) -> dict[str, dict[str, str]]:
    """Each chart's attributes (what it draws), by its first metric, in page order."""
    return page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll('.chart')].map(
            (c) => [c.dataset.metric, {...c.dataset}]))"""
    )


def _drag(page: Any, selector: str, start: float, end: float) -> None:
    """A person's drag across a chart, from ``start`` to ``end`` of its width."""
    box = page.locator(selector).bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * start, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * end, y, steps=6)
    page.mouse.up()


def test_a_drag_zooms_every_chart_and_fetches_that_range_at_full_resolution(
    tmp_path: Path, browser: Any
) -> None:
    """The zoom asked for `series?lo=0&hi=<last>` (the range widened to every marker):
    now it asks for the dragged range, every chart shows it, the loss at full resolution,
    and a double click shows the whole run again."""
    curve_journal(tmp_path / "long", steps=5000)  # more than 2 x 1000 points: downsampled
    with serve(str(tmp_path / "long")) as s:
        page = _open(browser, s.url + "run/long")
        asked: list[str] = []
        page.on("request", lambda r: asked.append(r.url) if "/series?" in r.url else None)
        whole = _charts(page)
        assert int(whole["lr"]["points"]) <= 2000
        _drag(page, ".chart-box.first .u-over", 0.40, 0.45)
        page.wait_for_selector("#charts[data-fetched]")
        lo, hi = map(float, page.get_attribute("#charts", "data-fetched").split(","))
        assert 1800 < lo < hi < 2500 and hi - lo < 400, (lo, hi)
        assert lo == int(lo) and hi == int(hi), (lo, hi)  # whole steps, not 62.35..93.53
        queries = [parse_qs(urlparse(u).query) for u in asked]
        assert {q["name"][0] for q in queries} >= {"loss", "val_loss", "lr", "grad_norm"}
        for q in queries:  # each curve asked for the dragged range, nothing wider
            assert (float(q["lo"][0]), float(q["hi"][0])) == (lo, hi), q
        shown = _charts(page)
        for name, chart in shown.items():
            assert (float(chart["xmin"]), float(chart["xmax"])) == (lo, hi), name
        # full resolution: one point per step in the range (val_loss has none there)
        steps_in = math.floor(hi) - math.ceil(lo) + 1
        assert int(shown["lr"]["points"]) == steps_in
        page.dblclick(".chart-box.first .u-over")
        wait_until(lambda: float(_charts(page)["lr"]["xmax"]) == 5000.0, 5, "the whole run again")
        assert page.get_attribute("#charts", "data-zoom") == ""
        assert page.errors == []
        page.close()


def test_log_axis_and_smoothing_change_what_is_drawn_and_numbers_read_3_digits(
    tmp_path: Path, browser: Any
) -> None:
    """The loss's log axis and the smoothing slider redraw the curves (a raw curve kept
    faint behind the smoothed one); the lr readout says 3 significant digits where it said
    `0.001` for 5.8e-4, and no chart's ticks read the same twice (`0.002, 0.002, 0.001`)."""
    curve_journal(tmp_path / "run", steps=400)
    with serve(str(tmp_path / "run")) as s:
        page = _open(browser, s.url + "run/run")
        loss = ".chart[data-curves='loss,val_loss']"

        def pixels() -> str:
            return str(page.eval_on_selector(loss + " canvas", "c => c.toDataURL()"))

        before, ticks = pixels(), page.get_attribute(loss, "data-yticks")
        assert page.get_attribute(loss, "data-scale") == "linear"
        page.check(".chart-box.first input.log")
        page.wait_for_selector(loss + "[data-scale='log']")
        log_ticks = page.get_attribute(loss, "data-yticks") or ""
        assert log_ticks != ticks and "1" in log_ticks.split("|"), log_ticks
        assert pixels() != before
        page.uncheck(".chart-box.first input.log")
        page.wait_for_selector(loss + "[data-scale='linear']")
        plain = pixels()
        page.eval_on_selector(
            "#smoothing", "s => { s.value = '0.9'; s.dispatchEvent(new Event('input')); }"
        )
        page.wait_for_selector(loss + "[data-smoothing='0.9']")
        legend = page.locator(loss + " .u-legend .u-series th").all_text_contents()
        assert [t.strip() for t in legend[1:]] == ["loss raw", "loss", "val_loss raw", "val_loss"]
        assert pixels() != plain
        # the readout at step 300: lr is about 1.9e-4 there, read in 3 significant digits
        lr = ".chart[data-curves='lr']"
        box = page.locator(lr + " .u-over").bounding_box()
        page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] / 2)
        readout = page.locator(lr + " .u-legend .u-series").nth(2).locator(".u-value")
        text = wait_until(lambda: readout.text_content() not in ("", "–"), 5, "a readout")
        value = float(readout.text_content() or "nan")
        assert text and 1e-4 < value < 4e-4 and len(readout.text_content() or "") <= 7
        for name, chart in _charts(page).items():
            for axis in ("xticks", "yticks"):
                labels = [t for t in chart[axis].split("|") if t]
                assert len(labels) == len(set(labels)), (name, axis, labels)
                assert all(len(t.replace("-", "").replace(".", "")) <= 7 for t in labels), labels
        assert page.errors == []
        page.close()


def test_compare_keeps_one_colour_per_run_on_every_chart(tmp_path: Path, browser: Any) -> None:
    """Three runs, one without the reported accuracy: each run is drawn in one colour on
    every chart, its uPlot legend and the runs table (red was one run on loss and another
    on report:accuracy); the header says each run's state, steps and best; markers turn
    off per run."""
    story_journal(tmp_path / "a", steps=60)
    curve_journal(tmp_path / "b", steps=80)  # no report: accuracy only in a and c
    story_journal(tmp_path / "c", steps=40, end=False).close()
    with serve(str(tmp_path)) as s:
        page = _open(browser, s.url + "compare?run=a&run=b&run=c")
        rows = page.locator("#compare-runs tr.run")
        colour = {
            rows.nth(i).get_attribute("data-key"): rows.nth(i).get_attribute("data-color")
            for i in range(rows.count())
        }
        assert len(colour) == 3 and len(set(colour.values())) == 3
        text = page.text_content("#compare-runs") or ""
        assert "stopped" in text and "60 / 60" in text and "accuracy 0.6 @ 60" in text
        charts = _charts(page)
        assert charts["report:accuracy"]["curves"] == "a,c"
        assert charts["loss"]["curves"] == charts["lr"]["curves"] == "a,b,c"
        order = list(charts)
        assert order[:3] == ["loss", "val_loss", "report:accuracy"], order
        for chart in charts.values():
            drawn = dict(kv.split("=") for kv in chart["colors"].split(","))
            assert drawn == {k: colour[k] for k in drawn}, chart
        # uPlot's own legend, drawn from the series' strokes
        for i in range(page.locator(".chart").count()):
            chart = page.locator(".chart").nth(i)
            for row in chart.locator(".u-legend .u-series").all()[1:]:
                key = (row.locator(".u-label").text_content() or "").strip()
                border = row.locator(".u-marker").evaluate("m => getComputedStyle(m).borderColor")
                assert border == _rgb(colour[key]), (key, border)
        assert page.locator("#strips .strip").count() == 3
        page.uncheck("#compare-runs input.markers[data-run='b']")
        wait_until(lambda: page.locator("#strips .strip").count() == 2, 5, "b's markers off")
        assert page.errors == []
        page.close()


def _rgb(hex_colour: str) -> str:
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def test_the_legend_shows_every_marker_drawn_in_its_colour_the_best_on_top(
    tmp_path: Path, browser: Any
) -> None:
    """Five removals at the best's step hid its mark; `kept` had the leased colour and the
    legend lacked `best` and `leased`. Now: one row per kind of thing, marks at one step
    grouped (the best on top), and every mark's colour is its legend entry's."""
    run = tmp_path / "run"
    w = story_journal(run, steps=60, end=False)
    for s in range(1, 6):  # five removals at step 60, where the best is saved
        w.append(
            "checkpoint_removed",
            {"checkpoint_path": str(run / f"checkpoints/old-{s}"), "reason": "rotation"},
            step=60,
        )
    w.append("checkpoint_kept", {"checkpoint_path": str(run / "checkpoints/step-000040"),
                                 "reason": "leased"}, step=60)  # fmt: skip
    w.close()
    acquire(run, run / "checkpoints/step-000040", holder="eval-1", ttl=300)
    with serve(str(run)) as s:
        page = _open(browser, s.url + "run/run")
        best = page.locator("#strip .marker.ck-best")
        assert best.get_attribute("data-step") == "60"
        assert best.evaluate("b => document.elementFromPoint(b.getBoundingClientRect().x + 5,"
                             " b.getBoundingClientRect().y + 5) === b")  # fmt: skip
        # the five removals and the kept one at step 60: one mark in their row, saying so
        removals = page.locator("#strip .marker[data-step='60'][data-kind='kept']")
        assert removals.count() == 1 and removals.get_attribute("data-n") == "6"
        assert page.locator("#strip .marker.kind-removed[data-step='60']").count() == 0
        looks = page.evaluate(
            """() => [...document.querySelectorAll('#strip .marker')].map(
                (m) => [m.dataset.look, getComputedStyle(m).backgroundColor])"""
        )
        legend = page.evaluate(
            """() => Object.fromEntries([...document.querySelectorAll('#legend .legend-item')]
                .map((i) => [i.dataset.look, getComputedStyle(i.querySelector('.swatch'))
                .backgroundColor]))"""
        )
        assert {look for look, _ in looks} == set(legend), (looks, legend)
        for look, background in looks:
            assert legend[look] == background, look
        assert {"fate:best", "fate:leased", "fate:removed", "kind:kept", "kind:removed"} <= set(
            legend
        )
        assert len(set(legend.values())) == len(legend)  # no two entries share a colour
        # the story says the five removals at step 60 in one line
        assert page.locator("#story tr[data-kind='removed'][data-n='5']").count() == 1
        assert page.errors == []
        page.close()


def test_no_page_is_wider_than_a_420_px_window(tmp_path: Path, browser: Any) -> None:
    """The run page was 751 to 1218 px wide at 420, the runs list 673 to 747: tables now
    scroll in their box, the charts fit, the header spans the window and a checkpoint's
    name is never broken (`step-` / `000040`)."""
    story_journal(tmp_path / "hostile-and-long-named-run", hostile=True)
    curve_journal(tmp_path / "b", steps=300)
    with serve(str(tmp_path), "--allow-control") as s:
        for url in (
            "",
            "run/hostile-and-long-named-run",
            "run/b",
            "compare?run=hostile-and-long-named-run&run=b",
        ):
            page = _open(browser, s.url + url, width=420)
            if url.startswith("run/"):
                page.wait_for_selector("body[data-tables='1']")
                # the checkpoints' step, best and markers columns are off-screen: it says so
                page.wait_for_function(
                    "document.querySelector('#checkpoints').closest('.scroll')"
                    ".previousElementSibling.matches('.scroll-note:not([hidden])')"
                )
            assert page_width(page) <= 420, (url, page_width(page))
            assert page.evaluate("document.querySelector('header').offsetWidth") == 420
            names = page.locator("#checkpoints td.name")
            for i in range(names.count()):  # one line each
                lines = names.nth(i).evaluate(
                    "n => { const r = document.createRange(); r.selectNodeContents(n);"
                    " return r.getClientRects().length; }"
                )
                assert lines == 1, names.nth(i).text_content()
            assert page.errors == [], url
            page.close()


def test_a_run_started_after_the_page_opened_appears_without_a_reload(
    tmp_path: Path, browser: Any
) -> None:
    """`serve DIR` on a dir with no run yet waits for one, as tail -f does (it failed with
    "no run"); the open runs list shows the run when it starts, then a second one."""
    runs = tmp_path / "runs"  # not there yet
    with serve(str(runs)) as s:
        assert "waiting for a run" in (s.proc.stderr.readline() if s.proc.stderr else "")
        page = _open(browser, s.url, width=1000)
        assert page.locator("tr.run").count() == 0 and page.is_visible("#no-runs")
        for n, name in enumerate(("first", "second"), start=1):
            with JournalWriter(runs / name) as w:
                w.append("train_begin", begin_payload(10))
                w.append("log", log_payload(1), step=1)
            wait_until(lambda n=n: page.locator("tr.run").count() == n, 10, f"{name} listed")
        page.click("tr.run[data-key='second'] a")
        page.wait_for_selector("body[data-painted='1']")
        assert page.text_content("#step") == "1"
        page.close()


def test_an_open_page_stays_true_leases_go_and_an_ended_run_takes_no_command(
    tmp_path: Path, browser: Any
) -> None:
    """A lease released while the page is open is gone from it within 2 s (it still said
    "58s left" 22 s later); once the run has ended the buttons turn off and say why (they
    stayed on, saying "applied at the next step")."""
    run = tmp_path / "run"
    w = story_journal(run, steps=40, end=False)
    lease = acquire(run, run / "checkpoints/step-000040", holder="eval-job-7", ttl=300)
    with serve(str(run), "--allow-control") as s:
        page = _open(browser, f"{s.url}run/run?token={s.token}")
        page.wait_for_selector("body[data-tables='1']")
        row = "tr.ckpt[data-step='40']"
        assert "eval-job-7" in (page.text_content(row + " td.leases") or "")
        assert page.get_attribute(row, "data-state") == "leased"
        assert page.is_enabled("#control-stop")
        release(run, lease.id)
        t = time.monotonic()
        wait_until(
            lambda: "eval-job-7" not in (page.text_content(row + " td.leases") or ""),
            2,
            "the released lease gone from the page",
        )
        assert time.monotonic() - t < 2
        wait_until(lambda: page.get_attribute(row, "data-state") == "on_disk", 2, "on disk")
        assert page.locator("#strip .marker.ck-leased").count() == 0
        w.append("train_end", {"status": "stopped", "reason": "enough"}, step=40)
        w.close()
        wait_until(lambda: not page.is_enabled("#control-stop"), 5, "the buttons off")
        assert not page.is_enabled("#control-save") and not page.is_enabled("#control-evaluate")
        said = page.text_content("#control-said") or ""
        assert "the run has ended (stopped at step 40)" in said, said
        assert page.errors == []
        page.close()


# -- at a glance: one server for the runs below ---------------------------------------------


def _alert(run: Path, aid: str, kind: str, step: int, message: str) -> None:
    with guest(run, role="watcher") as w:
        w.append("alert", {"id": aid, "kind": kind, "step": step, "message": message,
                           "attempt": 1, "evidence": [], "missing": [], "targets": ["json://127.0.0.1"],
                           "raised_at": time.time()})  # fmt: skip


def _running(run: Path, steps: int = 10) -> None:
    """A run at step ``steps`` of 100, a save at 5 and its report 3 steps later."""
    with JournalWriter(run) as w:
        w.append("train_begin", begin_payload(100))
        for s in range(1, steps + 1):
            w.append("log", log_payload(s), step=s)
            w.append("step_end", {"loss": 1.0}, step=s)
            if s == 5:
                path = str(run / "checkpoints/step-000005")
                w.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=5)
            if s == 8:  # an eval's result comes later, about the checkpoint of step 5
                w.append("report", {"checkpoint_path": str(run / "checkpoints/step-000005"),
                                    "step": 5, "metrics": {"accuracy": 0.5},
                                    "source": "eval"}, step=8)  # fmt: skip


@pytest.fixture(scope="module")
def glance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Served]]:
    """Runs as a person scans them: stopped (a), completed (b), running, hung, diverged,
    one still telling its alert's target, one with values near the float's limit."""
    root = tmp_path_factory.mktemp("glance")
    story_journal(root / "a", steps=60)
    curve_journal(root / "b", steps=80)
    for name in ("running", "hung", "telling"):
        _running(root / name)
    _alert(root / "hung", "h1", "hang", 10, "no step progress for 21s")
    _alert(root / "telling", "t1", "hang", 10, "no step progress for 21s")
    curve_journal(root / "diverged", steps=40)
    _alert(root / "diverged", "d1", "diverged", 30, "loss 9.1 above 1.0 for 3 evals")
    with JournalWriter(root / "huge") as w:
        w.append("train_begin", begin_payload(20))
        for s in range(1, 21):
            w.append("log", {**log_payload(s), "big": 1.7e308 * (-1) ** s}, step=s)
    with serve(str(root)) as served:
        yield root, served


def test_run_colours_are_no_marker_colours_and_compare_lines_are_the_runs(
    glance: tuple[Path, Served], browser: Any
) -> None:
    """Run 1 was the "save, on disk" blue and two runs' gold "best" lines could not be told
    apart: no run or curve colour is a marker's now, and in compare each run's marker
    lines are drawn in its own colour."""
    _, s = glance
    page = _open(browser, s.url + "compare?run=a&run=b")
    marks = page.evaluate("fetch('/api/config').then((r) => r.json())")["marks"]
    marker_colours = {
        k["color"].lower() for k in [*marks["kinds"].values(), *marks["fates"].values()]
    }
    rows = page.locator("#compare-runs tr.run")
    runs = {rows.nth(i).get_attribute("data-color") for i in range(rows.count())}
    assert len(runs) == 2 and not runs & marker_colours, runs
    lines = set((_charts(page)["loss"].get("lines") or "").split(","))
    assert lines == runs, lines  # a's saves, best and stop; b's saves: in their run's colour
    if SCREENSHOTS:
        page.screenshot(path=str(Path(SCREENSHOTS) / "serve-compare.png"))
    page.close()
    page = _open(browser, s.url + "run/a")
    for chart in _charts(page).values():
        curves = {kv.split("=")[1] for kv in chart["colors"].split(",")}
        assert not curves & marker_colours, chart["colors"]
    assert page.errors == []
    page.close()


def test_the_runs_list_marks_alerted_hung_and_diverged_runs_and_a_hung_run_has_no_eta(
    glance: tuple[Path, Served], browser: Any
) -> None:
    """A diverged run read "completed" with nothing else; a hung run showed an ETA."""
    _, s = glance
    page = _open(browser, s.url)
    assert page.locator("tr.run").count() == 7

    def marks(key: str) -> list[str]:
        return page.locator(f"tr.run[data-key='{key}'] .alert-mark").all_text_contents()

    assert marks("hung") == ["⚠ hung"] and marks("diverged") == ["⚠ diverged"]
    assert marks("running") == [] and marks("a") == []
    assert "loss 9.1" in (
        page.get_attribute("tr.run[data-key='diverged'] .alert-mark", "title") or ""
    )
    eta = {
        k: page.text_content(f"tr.run[data-key='{k}'] td:nth-child(7)") for k in ("running", "hung")
    }
    assert eta == {"running": "23s", "hung": "–"}, eta  # 90 steps of 0.25 s, and none
    # tokens/s in one format, whether the journal wrote 4096 or 4252.7 (it read "4096")
    rates = {k: page.text_content(f"tr.run[data-key='{k}'] td:nth-child(6)") for k in "ab"}
    assert rates == {"a": "4,096", "b": "4,273"}, rates
    if SCREENSHOTS:
        page.locator("#runs").screenshot(path=str(Path(SCREENSHOTS) / "serve-runs.png"))
    page.close()
    page = _open(browser, s.url + "run/hung")
    assert page.text_content("#facts .alert-mark") == "⚠ hung"
    assert "ETA –" in (page.text_content("#facts") or "")
    assert page.errors == []
    page.close()


def test_an_alert_row_says_its_kind_message_who_was_told_and_when(
    glance: tuple[Path, Served], browser: Any
) -> None:
    """An alert's row said just "alert", and its hover `raised_at: 1.8e9`, never who was
    told: now it says what happened, and who was told when that comes (the page open)."""
    root, s = glance
    page = _open(browser, s.url + "run/telling")
    page.wait_for_selector("body[data-tables='1']")
    row = page.locator("#story tr[data-kind='alert']")
    text = row.text_content() or ""
    assert "hang alert: no step progress for 21s" in text and "telling json://127.0.0.1" in text
    assert READABLE_TIME.search(text), text
    with guest(root / "telling", role="watcher") as w:
        w.append("alert_told", {"id": "t1", "told": ["json://127.0.0.1"], "failed": [],
                                "told_at": time.time()})  # fmt: skip
    wait_until(lambda: "told json://127.0.0.1 at" in (row.text_content() or ""), 5, "told")
    assert READABLE_TIME.search((row.text_content() or "").split(" told ")[1])
    title = row.get_attribute("title") or ""
    assert re.search(r"raised_at: \d{4}-", title) and re.search(r"told_at: \d{4}-", title), title
    # the report of step 8 about the checkpoint of step 5: its marker at 5, where its point is
    assert page.get_attribute("#strip .marker[data-kind='report']", "data-step") == "5"
    hidden = page.eval_on_selector_all(".scroll-note", "ns => ns.map((n) => n.hidden)")
    assert hidden and all(hidden)  # at 1400 px no table scrolls: no note
    assert page.errors == []
    page.close()


def test_a_filter_matching_nothing_says_so_and_short_curves_are_not_smoothed(
    glance: tuple[Path, Served], browser: Any
) -> None:
    """A filter matching nothing left a blank page and a dangling "constant:"; smoothing a
    3-point accuracy curve read far from its values."""
    _, s = glance
    page = _open(browser, s.url + "run/a")
    page.fill("#filter", "zzz")
    page.wait_for_selector("#no-match:not([hidden])")
    assert page.text_content("#no-match") == "no metric matches “zzz”"
    assert page.is_hidden("#constant") and page.get_attribute("#charts", "data-shown") == "0"
    page.fill("#filter", "")
    page.wait_for_selector("#no-match[hidden]", state="attached")
    assert page.is_visible("#constant")
    page.eval_on_selector(
        "#smoothing", "s => { s.value = '0.9'; s.dispatchEvent(new Event('input')); }"
    )
    page.wait_for_selector(".chart[data-smoothing='0.9']")

    def legend(metric: str) -> list[str]:
        sel = f".chart[data-metric='{metric}'] .u-legend .u-series th"
        return [t.strip() for t in page.locator(sel).all_text_contents()[1:]]

    assert legend("loss") == ["loss raw", "loss", "val_loss"]  # val_loss: 3 evals, as they are
    assert legend("report:accuracy") == ["report:accuracy"]
    assert page.errors == []
    page.close()


def test_values_near_the_float_limit_are_drawn_clipped_with_a_note(
    glance: tuple[Path, Served], browser: Any
) -> None:
    """±1.7e308 drew nothing (the range overflows): now they are drawn at ±1e307, the
    chart says so, and its axis has ticks."""
    _, s = glance
    page = _open(browser, s.url + "run/huge")
    chart = _charts(page)["big"]
    ticks = chart["yticks"].split("|")
    assert "1e307" in ticks and "-1e307" in ticks, ticks
    note = page.text_content(".chart-box[data-key='big'] .clipped") or ""
    assert "drawn at ±1e307" in note
    assert page.errors == []
    page.close()
