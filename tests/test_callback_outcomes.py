"""Issue 43, cases 10 to 12: what a Python callback gives back is never dropped without a
word, a callback class that cannot be built is one usage line, and a callback that fails on
every record prints and records a bounded amount. Real ``ilab-watch`` processes on journals
written by the writer."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest

from journal import read_all
from tests.helpers import cli, write_log_journal, write_run


def results(ckpt: Path) -> list[dict[str, Any]]:
    (path,) = (ckpt / "watch").glob("*.results.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_return_value_that_is_not_a_control_or_report_fails_its_delivery(
    ckpt: Path, tmp_path: Path
) -> None:
    """Was: dropped silently, the delivery "ok", so ``return Control.stop`` (no ``()``) was a
    stop that never happened. Now each such delivery fails in one line naming what came back
    (the missing ``()`` said as such), nothing of it is sent, and None is fine."""
    write_run(ckpt, steps=20, save_every=5)
    for step in (5, 10, 15, 20):
        Path(ckpt, "checkpoints", f"step-{step:06d}", "full_state").mkdir(parents=True)
    mod = tmp_path / "cb.py"
    mod.write_text(
        textwrap.dedent(
            """
            from journal import Control, Report

            def numbers():
                yield Control.stop("never made")

            class Steer:
                def on_train_begin(self, event, **data):
                    return [Control.save("fine"), Control.stop]  # nothing of it is sent

                def on_save(self, event, **data):
                    return {5: Control.stop, 10: "stop", 15: {"accuracy": 0.9}, 20: numbers()}[
                        event.step
                    ]

                def on_train_end(self, event, **data):
                    return None
            """
        )
    )
    proc = cli("ilab-watch", str(ckpt), "--replay", "--callback", f"{mod}:Steer")
    assert proc.returncode == 1, proc.stderr  # some delivery failed
    assert "Traceback" not in proc.stderr
    by_seq = {(r["event"], r["step"]): r for r in results(ckpt)}
    errors = {key: r["error"] for key, r in by_seq.items() if r["status"] == "failed"}
    assert errors == {
        ("train_begin", 0): "returned the method Control.stop (item 1 of the list it "
        "returned), not a Control: did you forget the ()?",
        ("save", 5): "returned the method Control.stop, not a Control: did you forget the ()?",
        ("save", 10): "returned str 'stop': a callback returns None, a Control, a Report, or "
        "a list of them",
        ("save", 15): "returned dict {'accuracy': 0.9}: a callback returns None, a Control, a "
        "Report, or a list of them",
        ("save", 20): "returned a generator (a function with yield or async def): a callback "
        "returns None, a Control, a Report, or a list of them",
    }
    assert by_seq["train_end", 20]["status"] == "ok"  # None: nothing to do
    for line in errors.values():  # each said on the console, in one line
        assert line in proc.stderr
    assert not list((ckpt / "control").glob("*.json"))  # nothing was sent, not even the save
    assert [r for r in read_all(ckpt / "journal.jsonl").records if r["event"] == "control"] == []


def _refused_callback(ckpt: Path, mod: Path) -> str:
    """``ilab-watch --callback MOD:Judge`` refused before anything ran: exit 2, no
    traceback, no state dir; its one error line."""
    proc = cli("ilab-watch", str(ckpt), "--replay", "--callback", f"{mod}:Judge")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert not (ckpt / "watch").exists()  # nothing ran
    return error


def test_a_callback_class_whose_constructor_raises_is_one_usage_line(
    ckpt: Path, tmp_path: Path
) -> None:
    """Was: a traceback and exit 1. Now as the other bad --callback specs: one line naming
    the class and the exception, exit 2, before anything runs."""
    write_run(ckpt, steps=4, save_every=2)
    mod = tmp_path / "needs_gpu.py"
    mod.write_text(
        textwrap.dedent(
            """
            class Judge:
                def __init__(self):
                    raise RuntimeError("no GPU here\\nsecond line")

                def on_save(self, event, **data):
                    pass
            """
        )
    )
    error = _refused_callback(ckpt, mod)
    assert (
        error
        == f"Error: {mod}:Judge: needs_gpu.Judge() raised RuntimeError: no GPU here\\x0asecond line"
    )


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ("raise SystemExit(0)", "needs_gpu.Judge() raised SystemExit: 0"),
        ("sys.exit('no GPU here')", "needs_gpu.Judge() raised SystemExit: no GPU here"),
        ("raise Halt('stop')", "needs_gpu.Judge() raised Halt: stop"),
    ],
)
def test_a_callback_constructor_that_exits_is_one_usage_line(
    ckpt: Path, tmp_path: Path, body: str, said: str
) -> None:
    """Was: a constructor's ``SystemExit(0)`` ended ``ilab-watch`` with exit 0, silently,
    nothing delivered. Now it, any SystemExit and any other BaseException (not Ctrl-C) is a
    failed construction: one line, exit 2, as a raising constructor is."""
    write_run(ckpt, steps=4, save_every=2)
    mod = tmp_path / "needs_gpu.py"
    mod.write_text(
        textwrap.dedent(
            f"""
            import sys

            class Halt(BaseException):
                pass

            class Judge:
                def __init__(self):
                    {body}

                def on_save(self, event, **data):
                    pass
            """
        )
    )
    error = _refused_callback(ckpt, mod)
    assert error == f"Error: {mod}:Judge: {said}"


def test_a_callback_module_that_exits_on_import_is_one_usage_line(
    ckpt: Path, tmp_path: Path
) -> None:
    """The same for ``sys.exit(0)`` while the ``--callback`` file is imported."""
    write_run(ckpt, steps=4, save_every=2)
    mod = tmp_path / "quits.py"
    mod.write_text("import sys\n\nsys.exit(0)\n")
    error = _refused_callback(ckpt, mod)
    assert error == f"Error: '{mod}:Judge': cannot import {mod}: SystemExit: 0"


def test_a_callback_failing_on_every_record_prints_and_records_a_bounded_amount(
    tmp_path: Path,
) -> None:
    """Was: a full traceback per record on stderr and in results.jsonl (100,000 records:
    268 MB of stderr, 185 MB of results). Now, over 5,000 records: the first 3 tracebacks,
    a line at 10, 100 and 1,000 failures, and "failed 5000 times in all" at the end; each
    failure keeps its results line with its one-line error, the first 5 and the last 5 with
    their tracebacks."""
    ckpt = tmp_path / "run"
    write_log_journal(ckpt, 5000)
    mod = tmp_path / "boom.py"
    mod.write_text(
        textwrap.dedent(
            """
            class Boom:
                def on_log(self, event, **data):
                    raise ValueError(f"bad record at step {event.step}")
            """
        )
    )
    argv = ("--replay", "--queue", "log=all", "--callback", f"{mod}:Boom")
    proc = cli("ilab-watch", str(ckpt), *argv, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr
    assert len(err) < 8000, err[-2000:]  # was about 2.7 KB per record: 13 MB
    assert err.count("Traceback (most recent call last)") == 3
    for n in (10, 100, 1000):
        assert f"Boom.on_log on log: {n} failures so far" in err
    assert "Boom.on_log on log failed 5000 times in all (seq 1 to 5000), the last: " in err
    assert "ilab-watch: done: 0 ok, 5000 failed" in err
    rows = results(ckpt)
    failed = [r for r in rows if r["status"] == "failed"]
    assert len(failed) == 5000 and all(
        r["error"].startswith("ValueError: bad record") for r in failed
    )
    with_tb = [r["seq"] for r in failed if r["stderr_tail"]]
    assert with_tb == [1, 2, 3, 4, 5]
    (summary,) = [r for r in rows if r["status"] == "failures"]
    assert summary["count"] == 5000 and (summary["seq"], summary["last_seq"]) == (1, 5000)
    assert summary["stderr_tail"].count("Traceback (most recent call last)") == 5
    for step in range(4996, 5001):
        assert f"ValueError: bad record at step {step}\n" in summary["stderr_tail"]
    size = sum(p.stat().st_size for p in (ckpt / "watch").glob("*.results.jsonl"))
    assert size < 5000 * 600, size  # a one-line error each (was 2.3 KB each: 11.5 MB)


def test_a_command_returned_at_train_end_is_journaled_as_rejected(
    ckpt: Path, tmp_path: Path
) -> None:
    """Was: its file left in ``control/`` with no verdict (the next attempt, if any, rejects
    it as stale). Now it is journaled as rejected, "the run had ended", and said in one
    line; nothing is left in ``control/``."""
    write_run(ckpt, steps=4, save_every=0)
    mod = tmp_path / "ours.py"
    mod.write_text(
        textwrap.dedent(
            """
            from journal import Control

            class AtEnd:
                def on_train_end(self, event, **data):
                    return [Control.stop("done"), Control.save("one more")]
            """
        )
    )
    proc = cli("ilab-watch", str(ckpt), "--replay", "--callback", f"{mod}:AtEnd")
    assert proc.returncode == 0, proc.stderr
    assert not list((ckpt / "control").glob("*.json"))
    recs = read_all(ckpt / "journal.jsonl").records
    verdicts = [r["data"] for r in recs if r["event"] == "control"]
    assert [v["command"] for v in verdicts] == ["stop", "save"]
    for v in verdicts:
        assert v["accepted"] is False and v["reason"] == "the run had ended (train_end at step 4)"
        assert v["applied_at_step"] is None and v["source"].endswith("ours.AtEnd.on_train_end")
        line = f"control {v['command']} (id {v['id']}) from {v['source']} on train_end rejected"
        assert line in proc.stderr
    (done,) = results(ckpt)
    assert [c.split(":")[0] for c in done["control"]] == ["stop", "save"]
    status = cli("ilab-journal", "status", str(ckpt))
    assert status.returncode == 0 and "arrived after the run ended" not in status.stdout


THEIRS = """
import json
from instructlab.training.callbacks import TrainerCallback
from training_hub import TrainingHubCallback
from journal import Control

OUT = {out!r}


def note(*row):
    with open(OUT, "a") as f:
        f.write(json.dumps(row) + "\\n")


class AsyncIlab(TrainerCallback):
    async def on_log(self, context):  # instructlab-training awaits it
        note("ilab", context.step)

    def on_save(self, context):
        return True  # their trainer ignores it: so do we


class HubAtEnd(TrainingHubCallback):
    def on_save(self, context):
        return Control.stop  # our Control, without its ()

    def on_train_end(self, context):
        context.control.should_save = True  # a last save: too late for this run
"""


@pytest.mark.extended  # importing instructlab-training and training-hub: about 20 s
def test_their_callbacks_async_hooks_run_and_commands_at_train_end_get_a_verdict(
    ckpt: Path, tmp_path: Path
) -> None:
    """InstructLab's ``async def`` hooks run (was: the coroutine dropped, never awaited); a
    hub callback's ``Control.stop`` without ``()`` fails its delivery saying so; its
    ``should_save`` at ``on_train_end`` is journaled as rejected, "the run had ended" (was:
    a file left in ``control/`` with no verdict)."""
    pytest.importorskip("training_hub", reason="training-hub is not installed")
    write_run(ckpt, steps=4, save_every=2)
    for step in (2, 4):
        Path(ckpt, "checkpoints", f"step-{step:06d}", "full_state").mkdir(parents=True)
    mod = tmp_path / "theirs.py"
    mod.write_text(THEIRS.format(out=str(tmp_path / "seen.jsonl")))
    specs = [x for name in ("AsyncIlab", "HubAtEnd") for x in ("--callback", f"{mod}:{name}")]
    proc = cli("ilab-watch", str(ckpt), "--replay", *specs, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the two on_save deliveries of HubAtEnd
    assert "was never awaited" not in proc.stderr
    seen = [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]
    assert seen == [["ilab", step] for step in range(1, 5)]
    failed = [r for r in results(ckpt) if r["status"] == "failed"]
    assert [(r["hook"], r["step"]) for r in failed] == [
        ("theirs.HubAtEnd.on_save", 2),
        ("theirs.HubAtEnd.on_save", 4),
    ]
    assert all(r["error"].endswith("not a Control: did you forget the ()?") for r in failed)
    assert not list((ckpt / "control").glob("*.json"))  # nothing left without a verdict
    verdicts = [
        r["data"] for r in read_all(ckpt / "journal.jsonl").records if r["event"] == "control"
    ]
    assert [v["command"] for v in verdicts] == ["save"]
    for v in verdicts:
        assert v["accepted"] is False and v["reason"] == "the run had ended (train_end at step 4)"
        assert v["applied_at_step"] is None
        assert f"control {v['command']} (id {v['id']})" in proc.stderr
    status = cli("ilab-journal", "status", str(ckpt))
    assert status.returncode == 0 and "arrived after the run ended" not in status.stdout
