"""``ilab-journal serve``: the api on hand-built journals (the real writer), live updates read
on from where they stopped, downsampling, the control endpoint's refusals, a hostile journal
shown as text, and one real-browser check (docs/serve.md). The end-to-end runs in a browser
are in tests/test_serve_runs.py (extended)."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from array import array
from pathlib import Path
from typing import Any

import orjson
import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
from starlette.testclient import TestClient

from journal.checkpoints.leases import acquire
from journal.serve.app import ServeConfig, build_app
from journal.serve.data import downsample
from journal.serve.fold import MAX_CURVES, MAX_LISTED, PRIORITY, REPORTED
from journal.serve.runs import RunSet
from journal.write.writer import JournalWriter
from tests.browser import (
    HOSTILE_IMG,
    HOSTILE_SCRIPT,
    serve,
    story_journal,
    wait_until,
)
from tests.helpers import ROOT, begin_payload, cli, log_payload

ORIGIN = "http://127.0.0.1:8420"


def client(*dirs: Path, allow_control: bool = False, token: str | None = None) -> TestClient:
    runs = RunSet([(str(d), d, False) for d in dirs])
    return TestClient(build_app(ServeConfig(runs, allow_control, token)), base_url=ORIGIN)


def test_run_api_tells_the_story(tmp_path: Path) -> None:
    run = tmp_path / "run"
    story_journal(run)
    acquire(run, run / "checkpoints/step-000060", holder="eval-job-7", ttl=300)
    body = client(run).get("/api/runs/run?width=1000").json()
    s = body["summary"]
    assert (s["state"], s["exit_code"], s["step"], s["total_steps"]) == ("stopped", 4, 60, 60)
    assert s["reason"] == "stop command: target" and "stopped" in s["meaning"]
    assert s["best"]["checkpoint_path"].endswith("step-000060") and s["best"]["value"] == 0.6
    series = {x["name"]: x for x in body["series"]}
    assert series["loss"]["x"] == [float(i) for i in range(1, 61)]
    assert series["val_loss"]["x"] == [20.0, 40.0, 60.0]
    assert series["report:accuracy"]["y"] == [0.2, 0.4, 0.6]
    kinds = [m["kind"] for m in body["markers"]]
    assert kinds.count("save") == 3 and kinds.count("evaluate") == 3
    assert kinds.count("report") == 3 and kinds.count("job") == 3
    assert (
        kinds.count("removed") == 1 and kinds[0] == "attempt" and kinds[-2:] == ["control", "end"]
    )
    stop = body["markers"][-2]["detail"]
    assert (stop["command"], stop["source"], stop["applied_at_step"]) == ("stop", "eval.py", 60)
    rows = {r["step"]: r for r in body["checkpoints"]}
    assert rows[20]["on_disk"] is False and rows[20]["state"] == "removed"
    assert rows[20]["removed"]["reason"].startswith("rotation")
    assert rows[20]["removed"]["step"] == 40 and rows[40]["on_disk"] is True
    assert (rows[40]["state"], rows[60]["state"]) == ("on_disk", "leased")
    assert [r["best"] for r in body["checkpoints"]] == [False, False, True]
    assert [h["holder"] for h in rows[60]["leases"]] == ["eval-job-7"]
    assert rows[40]["reports"][0]["metrics"] == {"accuracy": 0.4}
    assert rows[40]["jobs"][0] | {} == {
        "job_id": "1040",
        "scheduler": "slurm",
        "state": "COMPLETED",
        "node": "node1",
        "exit_code": 0,
        "hook": "save-eval",
        "log_path": None,
    }


def test_updates_read_on_from_where_they_stopped(tmp_path: Path) -> None:
    run = tmp_path / "run"
    w = story_journal(run, end=False, steps=30)
    c = client(run)
    snap = c.get("/api/runs/run").json()
    names = [x["name"] for x in snap["series"]]
    lengths = ",".join(str(x["n"]) for x in snap["series"])
    count, markers = snap["count"], len(snap["markers"])
    for s in (31, 32):
        w.append("log", log_payload(s, 0.5), step=s)
    up = c.get(f"/api/runs/run/updates?since={count}&n={lengths}&m={markers}").json()
    assert up["count"] == count + 2 and up["summary"]["step"] == 32
    loss = next(x for x in up["series"] if x["name"] == "loss")
    assert (loss["x"], loss["y"], loss.get("reset")) == ([31.0, 32.0], [0.5, 0.5], None)
    assert up["markers"] == [] and up["checkpoints"] is None  # no checkpoint changed
    # a resumed attempt goes back in steps: its curves are sent whole again, its start marked
    w.close()
    w2 = JournalWriter(run, resume=True)
    w2.append("train_begin", {**begin_payload(40), "resumed_from": "step-000020"}, step=20)
    w2.append("log", log_payload(21, 0.9), step=21)
    lengths = ",".join(str(x["n"]) for x in snap["series"][: names.index("loss")]) + ",32"
    up2 = c.get(f"/api/runs/run/updates?since={count + 2}&n={lengths}&m={markers}").json()
    loss = next(x for x in up2["series"] if x["name"] == "loss")
    assert loss["reset"] is True and loss["x"][-1] == 21.0 and loss["n"] == 21
    assert [m["kind"] for m in up2["markers"]] == ["attempt"]
    assert up2["markers"][0]["detail"]["resumed_from"] == "step-000020"
    w2.close()


def test_downsample_keeps_the_peaks_and_zoom_gives_full_resolution(tmp_path: Path) -> None:
    steps = array("d", range(100_000))
    values = array("d", [1.0] * 100_000)
    values[12_345], values[70_001] = 50.0, -7.0
    x, y = downsample(steps, values, None, None, 500)
    assert len(x) <= 1000 and x == sorted(x)
    assert max(y) == 50.0 and min(y) == -7.0 and 12_345.0 in x and 70_001.0 in x
    x, y = downsample(steps, values, 12_300.0, 12_400.0, 500)
    assert x == [float(i) for i in range(12_300, 12_401)]


def test_runs_list_newest_first_with_stale_flagged(tmp_path: Path) -> None:
    for name in ("old", "new"):
        w = JournalWriter(tmp_path / name)
        w.append("train_begin", begin_payload(10))
        w.append("log", log_payload(1), step=1)
        w.close()
    stale = tmp_path / "old/journal.jsonl"
    lines = stale.read_bytes().splitlines()
    recs = [orjson.loads(x) for x in lines]
    for r in recs:
        r["ts"] -= 3600  # an hour without a record: stale
    stale.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in recs))
    rows = client(tmp_path).get("/api/runs").json()["runs"]
    assert [r["key"] for r in rows] == ["new", "old"]
    assert rows[0]["state"] == "running" and rows[0]["stale"] is False
    assert rows[1]["state"] == "stale" and rows[1]["stale"] is True and rows[1]["exit_code"] == 6
    assert rows[1]["eta_s"] is None  # a run that went quiet gives no time to its end
    assert rows[0]["tokens_per_s"] == 4096.0 and rows[0]["eta_s"] == pytest.approx(9 * 0.25)


def test_many_metric_names_are_capped_curves_and_a_list(tmp_path: Path) -> None:
    """3,000 logged names and 100 reported ones: the first MAX_CURVES of each (and loss,
    lr, ...) are curves; the rest a list in the order met, one's curve read on demand; past
    MAX_LISTED names are no longer kept. Before: 3,100 curves, each its own chart."""
    run = tmp_path / "run"
    w = JournalWriter(run)
    w.append("train_begin", begin_payload(20))
    names = [f"m{i:04d}" for i in range(3000)]
    for s in range(1, 21):
        w.append("log", {**{n: s * 0.5 + i for i, n in enumerate(names)}, **log_payload(s)},
                 step=s)  # fmt: skip
        if s % 10 == 0:
            path = str(run / f"checkpoints/step-{s:06d}")
            w.append("save", {"checkpoint_path": path, "kind": ["full_state"]}, step=s)
            metrics = {f"task{i:03d}/acc": s / 100 + i for i in range(100)}
            report = {"checkpoint_path": path, "step": s, "metrics": metrics, "source": "eval"}
            w.append("report", report, step=s)
    w.close()
    c = client(run)
    body = c.get("/api/runs/run").json()
    curves = [x["name"] for x in body["series"]]
    logged = [n for n in curves if n.startswith("m")]
    reported = [n for n in curves if n.startswith(REPORTED)]
    assert logged == names[:MAX_CURVES] and len(reported) == MAX_CURVES
    assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= set(curves)  # the page's own
    assert len(curves) <= 2 * MAX_CURVES + len(PRIORITY)
    assert body["listed"][: 3000 - MAX_CURVES] == names[MAX_CURVES:]
    assert body["listed"][3000 - MAX_CURVES] == f"{REPORTED}task{MAX_CURVES:03d}/acc"
    assert body["listed_all"] is True and body["listed"][-1] == f"{REPORTED}task099/acc"
    one = c.get("/api/runs/run/series?name=m2999").json()  # read from the journal now
    assert (one["x"], one["y"][:2], one["n"]) == (
        [float(s) for s in range(1, 21)],
        [2999.5, 3000.0],
        20,
    )
    rep = c.get("/api/runs/run/series", params={"name": f"{REPORTED}task099/acc"}).json()
    assert (rep["x"], rep["y"]) == ([10.0, 20.0], [99.1, 99.2])
    assert c.get("/api/runs/run/series?name=nosuch").status_code == 404
    # past MAX_LISTED names: the fold keeps no more (its memory bounded in names)
    w = JournalWriter(run, resume=True)
    w.append("log", {f"x{i}": 1.0 for i in range(MAX_LISTED)}, step=21)
    w.close()
    up = c.get(f"/api/runs/run/updates?since={body['count']}").json()
    assert len(up["listed"]) == MAX_LISTED and up["listed_all"] is False
    assert len(up["series"]) <= 2 * MAX_CURVES + len(PRIORITY)


def _long_journal(run: Path, steps: int) -> None:
    """A running run of ``steps`` logs written straight with orjson (fast: no writer)."""
    run.mkdir(parents=True)
    t = 1.8e9
    lines = [{"v": 1, "seq": 0, "run_id": "long", "attempt": 1, "ts": t, "event": "train_begin",
              "step": 0, "data": begin_payload(steps * 2)}]  # fmt: skip
    for s in range(1, steps + 1):
        lines.append({"v": 1, "seq": s, "run_id": "long", "attempt": 1, "ts": t + s,
                      "event": "log", "step": s, "samples_seen": 8 * s,
                      "data": log_payload(s, 1.0 + (s % 97) / 97)})  # fmt: skip
    (run / "journal.jsonl").write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))


def test_an_update_from_far_behind_is_downsampled_and_bounded(tmp_path: Path) -> None:
    """``updates?since=0`` on 60k steps: each curve downsampled as the first paint has it
    (at most 2 * width points, ``reset``), not 60k points each (9 MB before); then the
    page, holding that, gets only what is new."""
    run = tmp_path / "run"
    _long_journal(run, 60_000)
    c = client(run)
    r = c.get("/api/runs/run/updates?since=0&width=1000")
    up = r.json()
    assert len(r.content) < 500_000, len(r.content)
    assert up["count"] == 60_001 and len(up["series"]) >= 5
    snap = c.get("/api/runs/run?width=1000").json()
    first = {x["name"]: x for x in snap["series"]}
    for x in up["series"]:
        assert x["reset"] is True and x["n"] == 60_000 and len(x["x"]) <= 2000
        assert (x["x"], x["y"]) == (first[x["name"]]["x"], first[x["name"]]["y"])
    loss = next(x for x in up["series"] if x["name"] == "loss")
    assert (min(loss["y"]), max(loss["y"]), loss["x"][0]) == (1.0, 1.0 + 96 / 97, 1.0)
    with open(run / "journal.jsonl", "ab") as f:
        rec = {"v": 1, "seq": 60_001, "run_id": "long", "attempt": 1, "ts": 1.9e9,
               "event": "log", "step": 60_001, "data": log_payload(60_001, 0.25)}  # fmt: skip
        f.write(orjson.dumps(rec) + b"\n")
    n = ",".join(str(x["n"]) for x in snap["series"])
    up = c.get(f"/api/runs/run/updates?since={up['count']}&n={n}&m={len(snap['markers'])}").json()
    loss = next(x for x in up["series"] if x["name"] == "loss")
    assert (loss["x"], loss["y"], loss.get("reset"), loss["n"]) == (
        [60_001.0],
        [0.25],
        None,
        60_001,
    )


def test_a_run_that_cannot_be_read_is_one_error_row(tmp_path: Path) -> None:
    """A runs root with a good run and one whose journal.jsonl is a directory, served by
    ``ilab-journal serve``: the list shows both, the bad one in the state ``error`` with
    a one-line reason; its page's api says why; the good run's page is whole."""
    story_journal(tmp_path / "good")
    (tmp_path / "bad" / "journal.jsonl").mkdir(parents=True)

    def get(url: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(url, timeout=30) as r:
                return r.status, orjson.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read())

    with serve(str(tmp_path)) as s, serve(str(tmp_path / "bad"), str(tmp_path / "good")) as s2:
        for server in (s, s2):
            code, body = get(server.url + "api/runs")
            assert code == 200, body
            rows = {r["key"]: r for r in body["runs"]}
            assert set(rows) == {"good", "bad"}
            assert (rows["good"]["state"], rows["good"]["step"]) == ("stopped", 60)
            bad = rows["bad"]
            assert (bad["state"], bad["reason"]) == (
                "error",
                "cannot read journal.jsonl: Is a directory",
            )
            assert bad["exit_code"] is None and "cannot be read" in bad["meaning"]
            code, body = get(server.url + "api/runs/bad")
            assert (code, body) == (500, {"error": "cannot read journal.jsonl: Is a directory"})
            assert get(server.url + "api/runs/bad/updates?since=0")[0] == 500
            code, body = get(server.url + "api/runs/good")
            assert code == 200 and body["summary"]["state"] == "stopped"


def _post(c: TestClient, headers: dict[str, str], body: Any = None) -> Any:
    return c.post(
        "/api/runs/run/control",
        content=orjson.dumps(body or {"command": "stop", "reason": "from the page"}),
        headers=headers,
    )


def test_control_needs_the_flag_the_token_and_the_same_origin(tmp_path: Path) -> None:
    run = tmp_path / "run"
    story_journal(run, end=False)
    json_ct = {"content-type": "application/json"}
    assert _post(client(run), {**json_ct, "x-ilab-token": "t"}).status_code == 403
    c = client(run, allow_control=True, token="secret-token")
    assert _post(c, json_ct).status_code == 403
    assert _post(c, {**json_ct, "x-ilab-token": "wrong"}).status_code == 403
    good = {**json_ct, "x-ilab-token": "secret-token"}
    assert _post(c, {**good, "origin": "http://evil.example"}).status_code == 403
    assert _post(c, {**good, "sec-fetch-site": "cross-site"}).status_code == 403
    assert (
        _post(c, {"x-ilab-token": "secret-token", "content-type": "text/plain"}).status_code == 415
    )
    assert _post(c, good, {"command": "abort"}).status_code == 400
    assert not (run / "control").exists() or not list((run / "control").glob("*.json"))
    r = _post(c, {**good, "origin": ORIGIN})
    assert r.status_code == 200, r.text
    files = list((run / "control").glob("*.json"))
    body = orjson.loads(files[0].read_bytes())
    assert (body["command"], body["reason"], body["id"]) == (
        "stop",
        "from the page",
        r.json()["id"],
    )
    assert body["source"] == "web:testclient"
    # another Host (a DNS-rebinding page) reads nothing
    other = TestClient(c.app, base_url="http://evil.example:8420")
    assert other.get("/api/runs").status_code == 403


def test_a_command_to_a_run_whose_journal_cannot_be_read_is_a_409(tmp_path: Path) -> None:
    """A run whose journal.jsonl is a directory: a press is a 409 in one line (a 500 and a
    traceback before; the test client raises what escapes the app), nothing written."""
    run = tmp_path / "run"
    (run / "journal.jsonl").mkdir(parents=True)
    c = client(run, allow_control=True, token="t")
    r = _post(c, {"content-type": "application/json", "x-ilab-token": "t"})
    assert (r.status_code, r.json()) == (
        409,
        {"error": "cannot send a command to this run: Is a directory"},
    )
    assert not (run / "control").exists()


def test_hostile_journal_is_text_in_the_api_and_the_page_holds_no_record(tmp_path: Path) -> None:
    run = tmp_path / "run"
    story_journal(run, hostile=True)
    c = client(run)
    page = c.get("/run/run")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert HOSTILE_IMG not in page.text and "eval.py" not in page.text  # a static page
    api = c.get("/api/runs/run")
    assert api.headers["content-type"] == "application/json"
    body = api.json()
    assert (
        body["markers"][-2]["detail"]["reason"] == f"target reached {HOSTILE_SCRIPT}{HOSTILE_IMG}"
    )
    assert f"report:accuracy{HOSTILE_IMG}" in {x["name"] for x in body["series"]}


def test_serve_cli_usage_errors(tmp_path: Path) -> None:
    # a dir with no run yet is waited for (tests/test_serve_page.py); a port taken is not
    with serve(str(tmp_path / "nowhere")) as s:
        port = urllib.parse.urlparse(s.url).port
        r = cli("ilab-journal", "serve", str(tmp_path), "--port", str(port))
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0, r.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in r.stderr and "Traceback" not in r.stderr
    # without the extra: one line naming it
    code = (
        "import sys; sys.modules['starlette'] = None; sys.modules['uvicorn'] = None; "
        "from journal.cli.main import main; sys.argv = ['ilab-journal', 'serve', '.']; main()"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=60,
    )
    assert r.returncode == 2 and "pip install 'ilab-journal[serve]'" in r.stderr
    assert "Traceback" not in r.stderr


# -- one real browser --------------------------------------------------------------------


def test_page_in_a_browser_shows_the_story_live_and_runs_no_script(
    tmp_path: Path, browser: Any
) -> None:
    """The hostile run's page: state, every save / eval / report / stop marker, the removed
    and the best checkpoint, hostile strings shown as text and never run; a record appended
    to the other (running) run shows in its open page; a run with more names than curves
    lists the rest, and draws one when it is clicked."""
    story_journal(tmp_path / "hostile", hostile=True)
    live = story_journal(tmp_path / "live", end=False, steps=20)
    with JournalWriter(tmp_path / "wide") as w:
        w.append("train_begin", begin_payload(5))
        for step in range(1, 6):
            w.append("log", {f"w{i:02d}": step * i for i in range(MAX_CURVES + 8)}, step=step)
    with serve(str(tmp_path)) as s:
        page = browser.new_page()
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(s.url + "run/hostile")
        page.wait_for_selector("body[data-tables='1']")
        assert page.text_content("#facts .state") == "stopped"
        strip = page.locator("#strip .marker")
        kinds = [strip.nth(i).get_attribute("data-kind") for i in range(strip.count())]
        assert {k: kinds.count(k) for k in ("save", "evaluate", "report", "control", "end")} == {
            "save": 3,
            "evaluate": 3,
            "report": 3,
            "control": 1,
            "end": 1,
        }
        assert page.locator("#strip .marker.kind-save.ck-removed").count() == 1
        assert page.get_attribute("#strip .marker.kind-save.ck-best", "data-step") == "60"
        assert page.locator("tr.ckpt[data-on-disk='false']").count() == 1
        assert HOSTILE_IMG in page.text_content("#story")
        assert HOSTILE_SCRIPT in page.text_content("#reason")
        assert page.evaluate("window.__pwned") is None and dialogs == []
        assert page.locator("main img, main script").count() == 0
        page.hover("#strip .marker.kind-control")  # the record, as text, on hover
        tip = page.text_content("#tip") or ""
        assert "command: stop" in tip and f"source: eval.py {HOSTILE_SCRIPT}{HOSTILE_IMG}" in tip
        page.goto(s.url + "compare?run=hostile&run=live")  # both runs' curves overlaid
        page.wait_for_selector("body[data-painted='1']")
        assert page.locator(".chart[data-curves='hostile,live']").count() == 2  # loss, val_loss
        assert page.locator("#constant button[data-name='lr']").count() == 1  # one value: a line
        assert page.evaluate("window.__pwned") is None and dialogs == []
        page.goto(s.url + "run/live")
        page.wait_for_selector("body[data-painted='1']")
        assert page.text_content("#step") == "20"
        live.append("log", log_payload(21, 0.1), step=21)
        wait_until(lambda: page.text_content("#step") == "21", 5, "the appended step in the page")
        live.close()
        # more names than curves: the rest listed, one drawn when clicked
        page.goto(s.url + "run/wide")
        page.wait_for_selector("body[data-painted='1']")
        assert page.get_attribute("#more", "data-n") == "8"
        assert page.locator(".chart[data-curves='w39']").count() == 0
        page.click("#more summary")  # the list opens (closed: it may be 10,000 names)
        page.click("#more button.metric[data-name='w39']")
        page.wait_for_selector(".chart[data-curves='w39']")
        page.close()


def test_plot_marks_kept_removed_best_stop_and_titles_the_run(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from journal.cli.plot import story

    run = tmp_path / "run"
    story_journal(run)
    st = story(run / "journal.jsonl")
    assert st.title.endswith("(attempt 1): stopped: stop command: target")
    marks = [(m.step, m.kind) for m in st.marks]
    assert marks == [(20, "removed"), (40, "kept"), (60, "best"), (60, "command"), (60, "end")]
    assert st.marks[3].label == "stop applied (eval.py)"
    assert set(st.curves) == {"loss", "val_loss", "lr", "report:accuracy"}
    r = cli("ilab-journal", "plot", str(run), "-o", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_a_quiet_run_that_writes_again_is_running_again(tmp_path: Path) -> None:
    from journal.serve import data
    from journal.serve.fold import RunFold

    run = tmp_path / "run"
    w = story_journal(run, end=False, steps=5)
    fold = RunFold(run / "journal.jsonl")
    fold.update()
    later = (fold.run.summarizer.summary.last_ts or 0) + 3600
    assert data.summary(fold, stale_after=60, now=later)["state"] == "stale"
    w.append("log", log_payload(6), step=6)
    w.close()
    assert fold.update() == 1
    assert data.summary(fold, stale_after=60)["state"] == "running"


def test_the_table_is_the_runs_fold_one_row_per_checkpoint_as_ls_shows(tmp_path: Path) -> None:
    """Issue 52: saves journaled with absolute paths, the watcher's removals after the end
    relative to its own working directory: each checkpoint is one row, in the state `ls`
    shows (step 30 and 40 were listed twice, "on disk" and "removed"), and plot marks them
    removed (it drew them kept)."""
    from journal.cli.plot import story
    from tests.test_run_fold import _late_eval_run

    run = tmp_path / "runs" / "b"
    run.mkdir(parents=True)
    _late_eval_run(run, tmp_path)
    body = client(run).get("/api/runs/b").json()
    rows = {r["name"]: r for r in body["checkpoints"]}
    assert len(body["checkpoints"]) == len(rows) == 6
    on_disk = sorted(n for n, r in rows.items() if r["on_disk"])
    assert on_disk == sorted(os.listdir(run / "checkpoints")) == ["step-000050", "step-000060"]
    assert [n for n, r in rows.items() if r["best"]] == ["step-000060"]
    gone = rows["step-000040"]["removed"]
    assert (gone["by"], gone["after_end"], rows["step-000040"]["state"]) == (
        "watcher",
        True,
        "removed",
    )
    with JournalWriter(run, join=True) as w:  # a curve to plot
        w.append("log", log_payload(60, 0.5), step=60)
    st = story(run / "journal.jsonl")
    marks = {m.label.split()[-1]: m.kind for m in st.marks if m.kind in ("kept", "removed", "best")}
    assert marks == {
        "step-000010": "removed",
        "step-000020": "removed",
        "step-000030": "removed",
        "step-000040": "removed",
        "step-000050": "kept",
        "step-000060": "best",
    }


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
     ("0.0.0.0", False), ("::", False), ("evil.example", False), ("10.0.0.1", False)],
)  # fmt: skip
def test_one_loopback_check_for_the_address_and_the_host_header(
    host: str, loopback: bool, tmp_path: Path
) -> None:
    """The address serve listens on and a request's Host header are judged by one function
    (it was written twice, in journal/cli/serve.py and journal/serve/app.py)."""
    import journal.cli.serve
    from journal.serve.app import is_loopback

    assert is_loopback(host) is loopback
    assert not hasattr(journal.cli.serve, "_is_loopback")
    shown = f"[{host}]" if ":" in host else host
    got = client(tmp_path).get("/api/config", headers={"host": f"{shown}:8420"})
    assert (got.status_code == 403) is not loopback  # a loopback server: that Host refused


def test_updates_send_the_table_again_when_a_lease_comes_or_goes(tmp_path: Path) -> None:
    """A lease taken, released or expired writes no record: the page's table went stale
    ("58s left" 22 s after the lease was gone). Each update now says the leases held (a
    signature): the table comes again when they differ from the page's; and the summary
    says when the run has ended (its controls turn off)."""
    from journal.checkpoints.leases import release

    run = tmp_path / "run"
    w = story_journal(run, end=False, steps=40)
    c = client(run)
    snap = c.get("/api/runs/run").json()
    n = ",".join(str(x["n"]) for x in snap["series"])

    def update(leases: str) -> Any:
        q = f"since={snap['count']}&n={n}&m={len(snap['markers'])}&leases={leases}"
        return c.get(f"/api/runs/run/updates?{q}").json()

    quiet = update(snap["leases"])
    assert quiet["checkpoints"] is None and quiet["leases"] == snap["leases"]
    assert quiet["summary"]["ended"] is False
    lease = acquire(run, run / "checkpoints/step-000040", holder="eval-job-7", ttl=300)
    taken = update(snap["leases"])
    rows = {r["step"]: r for r in taken["checkpoints"]}
    assert rows[40]["state"] == "leased" and rows[40]["leases"][0]["holder"] == "eval-job-7"
    assert taken["leases"] != snap["leases"] and update(taken["leases"])["checkpoints"] is None
    release(run, lease.id)
    gone = update(taken["leases"])
    assert gone["leases"] == snap["leases"]
    assert {r["step"]: r for r in gone["checkpoints"]}[40]["leases"] == []
    w.append("train_end", {"status": "stopped", "reason": "enough"}, step=40)
    w.close()
    assert update(gone["leases"])["summary"]["ended"] is True


def test_docs_list_every_marker_in_the_colours_the_page_draws() -> None:
    """docs/serve.md's marker table names each kind and save fate with the colour the
    page draws it in (journal/serve/marks.py, served to the page by /api/config)."""
    from journal.serve.marks import MARKER_KINDS, MARKER_STYLE, ROWS, SAVE_FATES

    doc = (ROOT / "docs/serve.md").read_text()
    table = [ln.strip() for ln in doc.splitlines() if ln.strip().startswith("| ") and "#" in ln]
    drawn = [s for kind, s in MARKER_STYLE.items() if kind != "save"]  # a save: by its fate
    for style in [*drawn, *SAVE_FATES.values()]:
        row = next((r for r in table if r.startswith(f"| {style.label} |")), None)
        assert row is not None, style.label
        assert f"{style.name} (`{style.color}`)" in row and f"| {style.row} |" in row, row
        assert ("| yes |" in row) is style.line, row
    assert set(MARKER_KINDS.values()) == set(MARKER_STYLE)
    assert {s.row for s in [*MARKER_STYLE.values(), *SAVE_FATES.values()]} <= set(ROWS)
    config = client(ROOT).get("/api/config").json()
    assert config["marks"]["kinds"]["report"]["color"] == MARKER_STYLE["report"].color


def test_an_alert_is_a_marker_at_the_step_it_is_about(tmp_path: Path) -> None:
    """An ``alert`` record (docs/alerts.md) is drawn in its own top row at the step the
    alert is about, which a hung trainer journals later, with its evidence paths."""
    from journal.store import guest

    run = tmp_path / "run"
    story_journal(run)
    evidence = ["alerts/a1/rank0.py-spy.txt", "alerts/a1/rank1.py-spy.txt"]
    with guest(run, role="watcher") as w:
        w.append("alert", {"id": "a1", "kind": "hang", "step": 40, "message": "no step for 21s",
                           "evidence": evidence, "missing": [], "targets": []})  # fmt: skip
    c = client(run)
    (alert,) = [
        m for m in c.get("/api/runs/run?width=100").json()["markers"] if m["kind"] == "alert"
    ]
    assert alert["step"] == 40 and alert["detail"]["kind"] == "hang"
    assert alert["detail"]["evidence"] == ", ".join(evidence)
    marks = c.get("/api/config").json()["marks"]
    assert marks["rows"][0] == "alerts" and marks["kinds"]["alert"]["row"] == "alerts"
    assert marks["kinds"]["alert"]["z"] > max(f["z"] for f in marks["fates"].values())
