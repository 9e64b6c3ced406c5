"""Results flowing back beside real 2-rank training: leases keep checkpoints while they are
evaluated, rotation still bounds disk use, the best checkpoint survives, and a watcher
killed with kill -9 leaves leases that expire."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from journal.checkpoints import leases
from tests.helpers import BIN, cli, records, train, train_argv, train_env, wait_for

pytestmark = pytest.mark.dist

SLOW_EVAL = textwrap.dedent(
    """
    import json, os, time
    from pathlib import Path
    ck = Path(os.environ["ILAB_CHECKPOINT_PATH"])
    json.loads((ck / "hf" / "config.json").read_text())  # the checkpoint is there ...
    time.sleep(float(os.environ.get("EVAL_SECONDS", "2")))
    json.loads((ck / "hf" / "config.json").read_text())  # ... for the whole eval
    step = int(os.environ["ILAB_STEP"])
    with open(os.environ["ILAB_REPORT"], "w") as f:
        json.dump({"accuracy": 1.0 if step == 9 else step / 1000}, f)
    """
)


class DiskSampler(threading.Thread):
    """Counts checkpoints on disk against what may be there: keep_last_n + the best + the
    leased ones. A released lease frees its checkpoint at the next rotation (the next save,
    or at once when training is over), so leases held within the last ``window`` seconds
    count, and +1 for a checkpoint just written, before its save's rotation."""

    def __init__(self, ckpt: Path, allowed_fixed: int, window: float) -> None:
        super().__init__(daemon=True)
        self.ckpt, self.allowed_fixed, self.window = ckpt, allowed_fixed, window
        self.stop = threading.Event()
        self.samples = 0
        self.violations: list[tuple[float, int, int]] = []
        self._seen: dict[str, float] = {}  # checkpoint -> last time it was leased

    def run(self) -> None:
        root = self.ckpt / "checkpoints"
        while not self.stop.wait(0.05):
            now = time.monotonic()
            for lease in leases.active(self.ckpt):
                self._seen[lease.checkpoint] = now
            on_disk = [p.name for p in root.glob("step-*")] if root.is_dir() else []
            for lease in leases.active(self.ckpt):
                self._seen[lease.checkpoint] = now
            recent = {c for c, t in self._seen.items() if now - t <= self.window}
            allowed = self.allowed_fixed + 1 + len(recent & set(on_disk))
            self.samples += 1
            if len(on_disk) > allowed:
                self.violations.append((now, len(on_disk), allowed))


@pytest.mark.extended
def test_slow_evals_beside_fast_rotation_lose_nothing(tmp_path: Path) -> None:
    """The issue's scenario, shortened: save every 3 steps, keep 2, an eval of ~1 s per
    checkpoint (several saves land during each eval). Before leases most evals failed; now
    every save is evaluated once, the best checkpoint outlives rotation, and a replay of the
    finished run skips what was removed."""
    ckpt = tmp_path / "run"
    script = tmp_path / "eval.py"
    script.write_text(SLOW_EVAL)
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(script), "--name", "eval"],
        env={**os.environ, "EVAL_SECONDS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    sampler = DiskSampler(ckpt, allowed_fixed=2 + 1, window=3.0)
    sampler.start()
    try:
        proc = train(
            ckpt,
            *("--max-steps", "36", "--save-every", "3", "--keep-last-n", "2"),
            *("--keep-best", "accuracy:max"),
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        code = watcher.wait(timeout=240)
    finally:
        watcher.kill()
        sampler.stop.set()
        sampler.join()
    assert code == 0, watcher.stderr.read()[-3000:]
    recs = records(ckpt)
    saves = [r["data"]["checkpoint_path"] for r in recs if r["event"] == "save"]
    assert len(saves) == 12
    results = [
        json.loads(x) for x in (ckpt / "watch" / "eval.results.jsonl").read_text().splitlines()
    ]
    assert [r["status"] for r in results] == ["ok"] * 12  # 0 failed, none skipped
    reports = [r["data"] for r in recs if r["event"] == "report"]
    assert sorted(r["checkpoint_path"] for r in reports) == sorted(saves)  # each once
    assert sampler.samples > 50 and sampler.violations == [], sampler.violations
    assert not list((ckpt / "leases").glob("*.json"))  # all released
    # The best (step 9, accuracy 1.0) is far older than the last 2 and still on disk.
    best = str(ckpt / "checkpoints" / "step-000009")
    assert Path(best, "hf", "config.json").is_file()
    q = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert q.returncode == 0 and q.stdout.strip() == best
    status = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert status["best_checkpoint"]["checkpoint_path"] == best
    end = next(r for r in reversed(recs) if r["event"] == "train_end")
    assert end["data"]["best_checkpoint"]["checkpoint_path"] == best
    removed = {r["data"]["checkpoint_path"] for r in recs if r["event"] == "checkpoint_removed"}
    on_disk = {str(p) for p in (ckpt / "checkpoints").glob("step-*")}
    assert removed and removed.isdisjoint(on_disk) and removed | on_disk == set(saves)

    # --replay of the finished run: removed checkpoints are skipped, the rest evaluated.
    fast = tmp_path / "fast.py"
    fast.write_text("print('ok')\n")
    replay = cli("ilab-watch", str(ckpt), "--replay", "--on-save", str(fast), "--name", "again")
    assert replay.returncode == 0, replay.stderr
    again = [
        json.loads(x) for x in (ckpt / "watch" / "again.results.jsonl").read_text().splitlines()
    ]
    by_status: dict[str, set[str]] = {}
    for r in again:
        path = next(s["data"]["checkpoint_path"] for s in recs if s["seq"] == r["seq"])
        by_status.setdefault(r["status"], set()).add(path)
    assert by_status == {"skipped": removed, "ok": on_disk}


HANGING_EVAL = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    Path(os.environ["MARK"]).write_text(os.environ["ILAB_CHECKPOINT_PATH"])
    time.sleep(600)
    """
)


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_watcher_killed_mid_eval_leaves_a_lease_that_expires(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    script, mark = tmp_path / "hang.py", tmp_path / "evaluating"
    script.write_text(HANGING_EVAL)
    job = subprocess.Popen(
        train_argv(ckpt, "--max-steps", "40", "--save-every", "2", "--keep-last-n", "1"),
        env=train_env(step_delay=0.2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-save", str(script), "--lease-ttl", "2"],
        env={**os.environ, "MARK": str(mark)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        first = Path(wait_for(lambda: mark.exists() and mark.read_text(), what="an eval started"))
        assert leases.leased(ckpt, {first.name}) == {first.name}
        seq_then = max(r["seq"] for r in records(ckpt))
        os.killpg(watcher.pid, signal.SIGKILL)  # the watcher and its eval, at once
        watcher.wait()

        def removed() -> Any:
            return next(
                (
                    r
                    for r in records(ckpt)
                    if r["event"] == "checkpoint_removed"
                    and r["data"]["checkpoint_path"] == str(first)
                ),
                None,
            )

        rec = wait_for(removed, timeout=60, what=f"{first.name} rotated after its lease expired")
        # Removed after the kill, once the lease had expired (its step may be an earlier
        # save's: an async save rotates when it finishes, journaled at the save's step).
        assert rec["seq"] > seq_then
        assert cli("ilab-journal", "control", "stop", str(ckpt)).returncode == 0  # seen enough
        _, err = job.communicate(timeout=180)
        assert job.returncode == 0, err[-3000:]
    finally:
        job.kill()
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
    assert not first.exists()


@pytest.mark.extended  # an end-to-end scenario beyond the default suite's one per area
def test_a_report_for_a_checkpoint_that_never_existed_cannot_cost_the_real_best(
    tmp_path: Path,
) -> None:
    """Issue 33's high case, with --keep-last-n 1 --keep-best accuracy:max: a report for
    step-000010 (it exists), then one for step-000999 (never saved) used to exit 0, become
    the best, and let rotation delete step-000010. Now the CLI refuses it (one line, exit
    2), a report file dropped into reports/ by hand for it is refused by the trainer with
    its reason, and step-000010 stays the best on disk, in train_end and in query --best."""
    ckpt = tmp_path / "run"
    policy = ("--save-every", "10", "--keep-last-n", "1", "--keep-best", "accuracy:max")
    first = train(ckpt, "--max-steps", "10", *policy)
    assert first.returncode == 0, first.stderr[-3000:]
    best = str(ckpt / "checkpoints" / "step-000010")
    ok = cli("ilab-journal", "report", str(ckpt), "--checkpoint", "step-000010", "accuracy=0.9")
    assert ok.returncode == 0, ok.stderr
    bogus = cli("ilab-journal", "report", str(ckpt), "--checkpoint", "step-000999", "accuracy=0.95")
    assert bogus.returncode == 2 and len(bogus.stderr.strip().splitlines()) == 1, bogus.stderr
    assert "step-000999" in bogus.stderr and "no such checkpoint" in bogus.stderr
    planted = {
        "id": "planted",
        "checkpoint_path": str(ckpt / "checkpoints" / "step-000999"),
        "step": 999,
        "metrics": {"accuracy": 0.99},
        "reported_at": time.time(),
    }
    (ckpt / "reports" / "planted.json").write_text(json.dumps(planted))
    second = train(ckpt, "--max-steps", "20", *policy)  # resumes; its save at 20 rotates
    assert second.returncode == 0, second.stderr[-3000:]
    recs = records(ckpt)
    assert [r["data"]["checkpoint_path"] for r in recs if r["event"] == "report"] == [best]
    refused = [r["data"] for r in recs if r["event"] == "control" and not r["data"]["accepted"]]
    assert len(refused) == 1 and "no such checkpoint" in refused[0]["reason"], refused
    assert Path(best, "full_state").is_dir()  # kept as the best
    on_disk = sorted(p.name for p in (ckpt / "checkpoints").iterdir())
    assert on_disk == ["step-000010", "step-000020"]
    end = recs[-1]
    assert end["event"] == "train_end" and end["data"]["best_checkpoint"]["checkpoint_path"] == best
    q = cli("ilab-journal", "query", str(ckpt), "--best", "accuracy:max")
    assert q.returncode == 0 and q.stdout.strip() == best
