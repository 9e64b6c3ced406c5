"""Every view of a run tells the fold's story (issue 52, "one truth of a run"): for journals
generated with hypothesis as a real run writes them (saves; rotation by the trainer with
absolute paths and by a watcher with relative, ``./`` and trailing-slash spellings, before
and after ``train_end``; reports before and after it; leases; commands accepted and
refused; alerts, told or not, journaled twice, a hang recovered; a restart of the same run),
``status``, ``query --best``, ``check``, serve's checkpoints table and run summary, plot's
marks and backtest's retention with the run's own settings all equal the fold's answer
(:class:`journal.views.fold.RunFold`), and the fold's on-disk set equals
``ls checkpoints/``."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from journal.checkpoints.leases import acquire, active, release
from journal.checkpoints.rotation import rotate
from journal.cli.main import main
from journal.cli.plot import story
from journal.views import index
from journal.views.fold import RunFold
from journal.write.writer import JournalWriter
from tests.helpers import begin_payload, cli, log_payload, make_checkpoint

GOAL = "acc:max"
SPELLINGS = ("absolute", "relative", "dot", "slash")

pytest.importorskip("starlette", reason="the serve extra is not installed")
from journal.serve import data  # noqa: E402
from journal.serve.fold import RunFold as PageFold  # noqa: E402


def spelled(path: Path, how: str) -> str:
    """A checkpoint's path as some process journals it."""
    rel = os.path.relpath(path)
    return {"absolute": str(path), "relative": rel, "dot": f"./{rel}", "slash": f"{rel}/"}[how]


class RunStory:
    """A run written as the trainer, a watcher and ``prune`` write it: the real writer, the
    real rotation (leases honoured), the best by the run's fold at each rotation."""

    def __init__(self, ckpt: Path, keep_last_n: int, keep_best: str | None) -> None:
        self.dir = ckpt.resolve()
        self.journal = self.dir / "journal.jsonl"
        self.config = {"keep_last_n": keep_last_n, "keep_best": keep_best}
        self.keep_last_n, self.goal = keep_last_n, keep_best
        self.w = JournalWriter(self.dir)
        self.w.append("train_begin", begin_payload(10_000, config=self.config))
        self.step, self.ended, self.attempt, self.alerts = 0, False, 1, 0
        self.hangs: list[str] = []  # the hang alerts' ids
        self.saved: list[Path] = []
        self.leases: dict[str, str] = {}  # checkpoint name -> lease id

    def fold(self) -> RunFold:
        fold = RunFold(self.dir)
        for line in self.journal.read_text().splitlines():
            fold.add(json.loads(line))
        return fold

    def rotate(self, by: str | None, how: str = "absolute") -> None:
        best = self.fold().best(self.goal) if self.goal else None
        keep = {Path(best.checkpoint_path).name} if best else set()

        def emit(event: str, payload: dict[str, Any]) -> None:
            if event == "checkpoint_removed" and by is not None:  # a guest's spelling
                path = spelled(Path(payload["checkpoint_path"]), how)
                payload = {**payload, "checkpoint_path": path, "by": by}
            self.w.append(event, payload, step=self.step)

        rotate(self.dir, self.keep_last_n, keep=keep, emit=emit, run_id=self.w.run_id)

    def save(self) -> None:
        if self.ended:
            return
        self.step += 10
        self.w.append("log", log_payload(self.step, 1.0 / self.step), step=self.step)
        path = make_checkpoint(self.dir, self.step, self.w.run_id)
        self.saved.append(path)
        self.w.append("save", {"checkpoint_path": str(path)}, step=self.step)
        self.rotate(by=None)  # the trainer, after each save

    def report(self, i: int, value: float, how: str) -> None:
        if self.saved:
            path = self.saved[i % len(self.saved)]
            report = {"checkpoint_path": spelled(path, how), "step": int(path.name[5:])}
            self.w.append("report", {**report, "metrics": {"acc": value}}, step=self.step)

    def lease(self, i: int) -> None:
        there = sorted(p for p in self.saved if p.exists() and p.name not in self.leases)
        if there:
            path = there[i % len(there)]
            self.leases[path.name] = acquire(self.dir, path, holder="eval", ttl=3600).id

    def release(self, i: int, how: str) -> None:
        if self.leases:
            name = sorted(self.leases)[i % len(self.leases)]
            release(self.dir, self.leases.pop(name))
            if self.ended:  # the watcher rotates the finished run when it lets go
                self.rotate(by="watcher", how=how)

    def command(self, accepted: bool) -> None:
        verdict = {"accepted": accepted, "source": "cli", "reason": "test"}
        verdict |= {"applied_at_step": self.step} if accepted else {"error": "refused"}
        self.w.append("control", {"command": "save", "id": f"c{self.step}", **verdict})

    def alert(self, kind: str, told: bool, twice: bool) -> None:
        """An alert as a guard journals it (a recovery resolves the newest hang), its
        outcome or not yet, and, ``twice``, its file journaled again (a crash before it
        was archived): one alert."""
        self.alerts += 1
        aid = f"{kind}-{self.alerts}"
        data = {"id": aid, "kind": kind, "step": self.step, "attempt": self.attempt}
        data |= {"message": f"{kind} at step {self.step}", "raised_at": 1.0}
        if kind == "recovered":
            data["resolves"] = self.hangs[-1] if self.hangs else None
        self.hangs += [aid] if kind == "hang" else []
        for _ in range(1 + twice):
            self.w.append("alert", data, step=self.step)
        if told:
            self.w.append("alert_told", {"id": aid, "told": ["json"], "told_at": 2.0})

    def end(self) -> None:
        if not self.ended:
            self.w.append("train_end", {"status": "completed"}, step=self.step)
            self.w.close()
            self.w = JournalWriter(self.dir, join=True)  # guests write after the end
            self.ended = True

    def restart(self) -> None:
        if self.ended:  # attempt 2 of the same run
            self.w.close()
            self.w = JournalWriter(self.dir, resume=True)
            there = [p for p in self.saved if p.exists()]
            resumed = str(there[-1]) if there else None
            payload = {**begin_payload(10_000, config=self.config), "resumed_from": resumed}
            self.w.append("train_begin", payload, step=self.step)
            self.ended, self.attempt = False, self.attempt + 1

    def apply(self, op: tuple[Any, ...]) -> None:
        kind, *args = op
        if kind == "prune":  # a watcher's rotation, before or after the end
            self.rotate(by="watcher", how=args[0])
        else:
            getattr(self, kind)(*args)


def _op(kind: str) -> st.SearchStrategy[tuple[Any, ...]]:
    index, spelling = st.integers(0, 20), st.sampled_from(SPELLINGS)
    args: dict[str, tuple[st.SearchStrategy[Any], ...]] = {
        "report": (index, st.floats(0, 1, allow_nan=False), spelling),
        "lease": (index,),
        "release": (index, spelling),
        "command": (st.booleans(),),
        "prune": (spelling,),
        "alert": (st.sampled_from(ALERT_KINDS), st.booleans(), st.booleans()),
    }
    return st.tuples(st.just(kind), *args.get(kind, ()))


#: While training: saves and reports most often (rotation needs several saves), the rest
#: now and then; after the end: late reports, leases let go, a watcher's rotation.
TRAINING = ["save"] * 5 + ["report"] * 3 + ["lease", "release", "command", "prune", "alert"]
AFTER = ["report", "report", "release", "prune", "lease", "command", "alert"]
ALERT_KINDS = ("hang", "hang", "recovered", "died", "failed", "diverged")


def _attempt(ended: bool) -> st.SearchStrategy[list[tuple[Any, ...]]]:
    training = st.lists(st.sampled_from(TRAINING).flatmap(_op), min_size=1, max_size=14)
    after = st.lists(st.sampled_from(AFTER).flatmap(_op), max_size=8)
    if not ended:
        return training
    return st.tuples(training, after).map(lambda t: [*t[0], ("end",), *t[1]])


#: One or two attempts of the run (the second a restart), the last one ended or not.
ops = st.tuples(_attempt(True), st.booleans(), st.booleans()).flatmap(
    lambda t: (
        st.just(t[0])
        if not t[1]
        else _attempt(t[2]).map(lambda second: [*t[0], ("restart",), *second])
    )
)


@contextmanager
def written(
    steps: list[tuple[Any, ...]],
    keep_last_n: int,
    keep_best: str | None,
    story: type[RunStory] | None = None,
) -> Iterator[Path]:
    """The run of ``steps`` (told by ``story``: RunStory by default) in a fresh dir
    (hypothesis runs many in one test); what the caller writes under the dir's
    parent's parent is removed with it."""
    base = Path(tempfile.mkdtemp(prefix="views-agree-"))
    try:
        run = (story or RunStory)(base / "runs" / "b", keep_last_n, keep_best)
        for op in steps:
            run.apply(op)
        run.w.close()
        yield run.dir
    finally:
        shutil.rmtree(base, ignore_errors=True)


def invoke(*args: str) -> str:
    got = CliRunner().invoke(main, list(args))
    assert got.exit_code in (0, 1, 3, 4, 8), got.output  # status exits with the run's state
    return got.output


def assert_views_agree(run: Path, keep_best: str | None) -> None:
    fold = index.summarize(run / "journal.jsonl", use_index=False).fold
    views = fold.checkpoints(leases=active(run))
    on_disk = {v.fate.name for v in views if v.on_disk}
    removed = {v.fate.name for v in views if v.state == "removed"}
    best = fold.best(keep_best) if keep_best else None
    best_name = Path(best.checkpoint_path).name if best else None
    # the disk: what `ls` shows, each checkpoint once whatever spelling journaled it
    ls = os.listdir(run / "checkpoints") if (run / "checkpoints").exists() else []
    assert on_disk == set(ls)
    assert len({v.fate.key for v in views}) == len(views)
    assert {v.fate.name for v in views if v.best} == ({best_name} if best_name else set())
    # status and query --best
    status = json.loads(invoke("status", str(run), "--json"))
    got = status["best_checkpoint"]
    assert (Path(got["checkpoint_path"]).name if got else None) == best_name
    if keep_best:  # the path, or exit 1 and one line when none has a value
        got_best = CliRunner().invoke(main, ["query", str(run), "--best", keep_best])
        query = got_best.output.strip() if got_best.exit_code == 0 else None
        assert (Path(query).name if query else None) == best_name, got_best.output
    # the alerts: status, check and the page say the fold's count, newest and hung state
    now = status["last_ts"] + 1
    judged, alerts = fold.judged(now=now)
    assert (status["alerts"], status["last_alert"]) == (judged.alerts, judged.last_alert)
    assert status["state"] == judged.state
    count = judged.alerts
    checked = CliRunner().invoke(main, ["check", str(run), "-e", f"alerts == {count}"])
    running = judged.state == "running"  # check judges a run once it ended, or hung
    assert checked.exit_code == (3 if running else 0), checked.output
    # serve's checkpoints table
    page = PageFold(run / "journal.jsonl")
    page.update()
    shown = data.summary(page, stale_after=1e9, now=now)
    assert shown["last_alert"] == judged.last_alert
    assert shown["alert_kinds"] == sorted({a.kind for a in alerts} - {"recovered"})
    assert shown["state"] == judged.state
    rows = data.checkpoints(page)
    assert {r["name"]: r["state"] for r in rows} == {v.fate.name: v.state for v in views}
    assert {r["name"] for r in rows if r["best"]} == ({best_name} if best_name else set())
    held = {r["name"] for r in rows if r["leases"]}
    assert held == {v.fate.name for v in views if v.leases}
    # plot's marks: every save marked as the fold says
    if views:
        kinds = {m.label.split()[-1]: m.kind for m in story(run / "journal.jsonl").marks}
        want = {"best" if n == best_name else "kept" for n in on_disk}
        assert {kinds[n] for n in on_disk} <= want
        assert all(kinds[n] == "removed" for n in removed)
        if best_name:
            assert kinds[best_name] == "best"
    # backtest's retention with the run's own settings: what the run kept and removed
    bt = json.loads(invoke("backtest", str(run), "--json"))
    assert bt["best_checkpoint"] == status["best_checkpoint"]
    assert (bt["status"], bt["stop_source"]) == (status["state"], status["stop_source"])
    retention = bt["retention"][0]
    assert set(retention["kept"]) == on_disk
    assert set(retention["removed"]) == removed


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=ops, keep_last_n=st.integers(1, 3), keep_best=st.sampled_from([GOAL, None]))
# hung in its second attempt: backtest once folded no alert and said "running"
@example(
    steps=[("save",), ("end",), ("restart",), ("alert", "hang", False, True)],
    keep_last_n=2,
    keep_best=None,
)
def test_every_view_tells_the_folds_story(
    steps: list[tuple[Any, ...]], keep_last_n: int, keep_best: str | None
) -> None:
    with written(steps, keep_last_n, keep_best) as run:
        assert_views_agree(run, keep_best)


def test_a_late_eval_with_leases_and_a_restart_through_the_installed_cli() -> None:
    """One fixed story, asked through the installed ``ilab-journal`` (a subprocess): a lease
    keeps step 20 through the trainer's rotation, its report after the end makes it the
    best, the watcher prunes with relative paths; a second attempt saves on."""
    steps = [("save",), ("save",), ("report", 0, 0.1, "absolute"), ("lease", 1), ("save",)]
    steps += [("save",), ("end",), ("report", 1, 0.9, "relative"), ("release", 0, "dot")]
    steps += [("restart",), ("save",), ("end",), ("prune", "slash")]
    with written(steps, 1, GOAL) as run:
        assert_views_agree(run, GOAL)
        status = json.loads(cli("ilab-journal", "status", str(run), "--json").stdout)
        assert Path(status["best_checkpoint"]["checkpoint_path"]).name == "step-000020"
        out = cli("ilab-journal", "backtest", str(run)).stdout
        assert "keeps step-000020, step-000050" in out, out
        assert sorted(os.listdir(run / "checkpoints")) == ["step-000020", "step-000050"]


def _page_rows(run: Path) -> list[dict[str, Any]]:
    page = PageFold(run / "journal.jsonl")
    page.update()
    return data.checkpoints(page)


def _views(run: Path) -> dict[str, Any]:
    """What each view says of a run, its dir spelled ``RUN`` (the installed CLI)."""

    def asked(*args: str) -> Any:
        out = cli("ilab-journal", *args).stdout.replace(str(run), "RUN")
        return json.loads(out) if out.startswith("{") else out.strip()

    status = asked("status", str(run), "--json")
    for key in ("records", "last_ts", "started_ts"):  # the lines in the file; when written
        del status[key]
    check = asked("check", str(run), "-e", "best(acc) > 0", "-e", "best(loss) > 0", "--json")
    backtest = asked("backtest", str(run), "--json")
    return {
        "status": status,
        "check": [e["values"] for e in check["expectations"]],
        "query": asked("query", str(run), "--best", GOAL),
        "page": [(r["name"], r["state"], r["best"], r["metrics"]) for r in _page_rows(run)],
        "backtest": (backtest["best_checkpoint"], backtest["retention"]),
    }


def test_a_record_of_another_run_amid_the_run_changes_no_view(tmp_path: Path) -> None:
    """Records naming another run id in the middle of a run (written by hand or by a
    foreign writer: every writer of a run journals under its id) are none of the run's:
    ``check``'s metrics, ``status``, ``query --best``, the page and ``backtest`` say what
    they say without them, by the fold's one rule (issue 58)."""
    runs = []
    for name, foreign in (("plain", False), ("foreign", True)):
        run = (tmp_path / name).resolve()
        with JournalWriter(run, run_id="r1") as w:
            config = {"keep_best": GOAL, "keep_last_n": 1}
            w.append("train_begin", begin_payload(100, config=config))
            for step in (10, 20):
                w.append("log", log_payload(step, 0.5), step=step)
                path = str(make_checkpoint(run, step, w.run_id))
                w.append("save", {"checkpoint_path": path}, step=step)
                report = {"checkpoint_path": path, "step": step, "metrics": {"acc": step / 100}}
                w.append("report", report, step=step)
            w.append("train_end", {"status": "completed"}, step=20)
        if foreign:  # amid the run's records: another run's report, log, eval and save
            lines = (run / "journal.jsonl").read_text().splitlines()
            other = {"v": 1, "run_id": "another-run", "attempt": 1, "ts": 1.0, "step": 10}
            bad = [
                {"event": "report", "data": {"checkpoint_path": path, "step": 20,
                                             "metrics": {"acc": 0.99}}},
                {"event": "log", "data": log_payload(10, 0.001)},
                {"event": "evaluate", "data": {"loss": 0.002, "acc": 0.98}},
                {"event": "save", "data": {"checkpoint_path": str(run / "checkpoints/step-000030")}},
            ]  # fmt: skip
            make_checkpoint(run, 30, "another-run")  # on disk: folded, it would be a row
            forged = [json.dumps({**other, "seq": 100 + i, **r}) for i, r in enumerate(bad)]
            (run / "journal.jsonl").write_text("\n".join([*lines[:4], *forged, *lines[4:]]) + "\n")
            (run / "journal.index.json").unlink(missing_ok=True)
        runs.append(_views(run))
    plain, foreign = runs
    assert plain["check"] == [{"best(acc)": 0.2}, {"best(loss)": 0.5}]
    assert plain["query"] == "RUN/checkpoints/step-000020"
    assert foreign == plain


def test_a_save_naming_a_path_outside_the_run_is_no_checkpoint_of_it(tmp_path: Path) -> None:
    """A save record naming ``/etc`` (or any path outside the run dir) is no checkpoint of
    the run in any view: not on disk on the page, never the best, not kept by backtest's
    retention, not held (issue 58)."""
    run = (tmp_path / "run").resolve()
    with JournalWriter(run) as w:
        w.append("train_begin", begin_payload(100, config={"keep_best": GOAL, "keep_last_n": 1}))
        for step, path in ((10, "/etc"), (20, str(make_checkpoint(run, 20, w.run_id)))):
            w.append("log", log_payload(step), step=step)
            w.append("save", {"checkpoint_path": path}, step=step)
            report = {"checkpoint_path": path, "step": step, "metrics": {"acc": 1 - step / 100}}
            w.append("report", report, step=step)
        w.append("train_end", {"status": "completed"}, step=20)
    views = _views(run)
    assert views["page"] == [("step-000020", "on_disk", True, {"acc": 0.8})]
    assert views["query"] == "RUN/checkpoints/step-000020"
    assert views["status"]["best_checkpoint"]["checkpoint_path"] == "RUN/checkpoints/step-000020"
    best, [retention] = views["backtest"]
    assert best == views["status"]["best_checkpoint"]
    assert (retention["kept"], retention["held"]) == (["step-000020"], [])
    assert_views_agree(run, GOAL)
