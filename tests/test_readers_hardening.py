"""The readers (status, show, tail, query, stats, validate) against records a user or a
broken tool wrote: wrong field types, markup and terminal escapes, event names that do not
exist, a run that has not written its journal yet. Real files, real subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from journal import JournalWriter
from journal.rundir.lock import RunLock
from tests.helpers import BIN, cli, write_run

#: The issue's examples of records with fields of the wrong type, plus two more.
BAD_RECORDS = {
    "report metrics a string": ("report", {"step": 4}, {"id": "x", "metrics": "x"}),
    "ts a string": ("log", {"ts": "yesterday"}, {"loss": 1.0}),
    "config a string": ("train_begin", {}, {"config": "str", "total_steps": 5}),
    "step an object": ("save", {"step": {}}, {"checkpoint_path": "/c/step-000009"}),
    "pid a string": ("train_begin", {}, {"config": {}, "pid": "1", "hostname": "h"}),
    "train_end status unknown": ("train_end", {}, {"status": "exploded"}),
}


def _record(
    seq: int, event: str, envelope: dict[str, Any], data: dict[str, Any], run_id: str = "r1"
) -> bytes:
    rec = {
        "v": 1,
        "seq": seq,
        "run_id": run_id,
        "attempt": 1,
        "ts": 1.0e9,
        "event": event,
        "step": 4,
        "epoch": 0,
        "samples_seen": 0,
        "data": data,
        **envelope,
    }
    return orjson.dumps(rec) + b"\n"


def _run_with(ckpt: Path, event: str, envelope: dict[str, Any], data: dict[str, Any]) -> None:
    """A completed run that keeps the best by accuracy, with a record of ``event`` (its
    envelope and payload changed as given) among its records."""
    ck = str(ckpt / "checkpoints/step-000004")
    Path(ck).mkdir(parents=True)  # the best checkpoint is one on disk
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {"keep_best": "accuracy:max"}, "total_steps": 4})
        w.append("log", {"loss": 0.5, "lr": 0.1}, step=4)
        w.append("save", {"checkpoint_path": ck, "kind": ["hf"], "duration": 1.0}, step=4)
        report = {"id": "r", "checkpoint_path": ck, "step": 4, "metrics": {"accuracy": 0.7}}
        w.append("report", {**report, "reported_at": 1.0}, step=4)
        w.flush()
        with open(ckpt / "journal.jsonl", "ab") as f:  # line 5, between the writer's
            f.write(_record(w.seq, event, envelope, data, w.run_id))
        w.seq += 1
        w.append("train_end", {"status": "completed"}, step=4)


#: Three cases in the default suite (a bad envelope, a bad step, a bad status); the rest
#: are extended: every reader runs as a CLI process, about 8 s a case on 2 cores.
DEFAULT_CASES = {"ts a string", "step an object", "train_end status unknown"}


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=() if c in DEFAULT_CASES else pytest.mark.extended)
        for c in sorted(BAD_RECORDS)
    ],
)
def test_a_record_with_wrong_field_types_is_skipped_and_counted_by_every_reader(
    ckpt: Path, case: str
) -> None:
    event, envelope, data = BAD_RECORDS[case]
    _run_with(ckpt, event, envelope, data)
    d = str(ckpt)
    runs = {
        "status": cli("ilab-journal", "status", d),
        "status --json": cli("ilab-journal", "status", d, "--json"),
        "show": cli("ilab-journal", "show", d),
        "show --last": cli("ilab-journal", "show", d, "--last", "5"),
        "show --since-step": cli("ilab-journal", "show", d, "--since-step", "0"),
        "tail": cli("ilab-journal", "tail", d, "-n", "5"),
        "query --best": cli("ilab-journal", "query", d, "--best", "accuracy:max"),
        "query --event": cli("ilab-journal", "query", d, "--event", event, "--field", "seq"),
        "stats": cli("ilab-journal", "stats", d, "--json"),
        "validate": cli("ilab-journal", "validate", d, "--json"),
    }
    for name, proc in runs.items():
        assert "Traceback" not in proc.stderr + proc.stdout, (name, proc.stderr)
    # status reads the run as it is (completed: 0), never 1 ("failed") because of the record
    assert runs["status"].returncode == 0, runs["status"].stdout
    status = json.loads(runs["status --json"].stdout)
    assert status["state"] == "completed" and status["invalid_lines"] == 1
    assert status["best_checkpoint"]["value"] == 0.7
    for name in ("show", "show --last", "show --since-step", "tail"):
        assert runs[name].returncode == 0, (name, runs[name].stderr)
        assert "skipped: '" in runs[name].stderr, name  # names the field
        assert "train_end" in runs[name].stdout, name
    assert runs["query --best"].stdout.strip().endswith("step-000004")
    assert runs["query --event"].stdout.strip() != "4"  # never the skipped record's seq
    assert json.loads(runs["stats"].stdout)["invalid_lines"] == 1
    report = json.loads(runs["validate"].stdout)
    assert runs["validate"].returncode == 1 and not report["ok"]
    assert any("line 5" in p for p in report["problems"])


def test_the_type_rules_reject_only_what_the_schema_rejects() -> None:
    """Readers skip a record only when journal/record/schema.py says it is invalid too, so a valid
    record of any writer is never lost; and each rule does reject a wrong type."""
    from pydantic import ValidationError

    from journal.record.fields import ENVELOPE_TYPES, PAYLOAD_TYPES, record_problem
    from journal.record.schema import PAYLOAD_MODELS, RecordModel

    valid = {
        "train_begin": {
            "config": {},
            "world_size": 1,
            "nnodes": 1,
            "device_type": "cpu",
            "journal_detail": "step",
            "resumed_from": None,
            "total_steps": 1,
            "hostname": "h",
            "pid": 1,
            "versions": {},
        },
        "log": {"loss": 1.0, "lr": 0.1},
        "evaluate": {"val_loss": 1.0},
        "save": {"checkpoint_path": "/c", "kind": ["hf"], "duration": 1.0},
        "report": {
            "id": "r",
            "checkpoint_path": "/c",
            "step": 1,
            "metrics": {},
            "reported_at": 1.0,
        },
        "train_end": {"status": "completed"},
        "control": {"command": "stop", "id": "c", "accepted": True},
        "checkpoint_removed": {"checkpoint_path": "/c", "reason": "r"},
        "journal_gap": {"dropped": 1, "first_seq": 1, "last_seq": 1, "error": "e"},
    }
    wrong = {int: "1", float: "1.5", str: 5, dict: "x", bool: "true"}

    def schema_accepts(rec: dict[str, Any]) -> bool:
        try:
            RecordModel.model_validate(rec, strict=True)
            PAYLOAD_MODELS[rec["event"]].model_validate(rec["data"], strict=True)
        except ValidationError:
            return False
        return True

    assert set(PAYLOAD_TYPES) == set(valid)
    for event, data in valid.items():
        base = orjson.loads(_record(1, event, {}, data))
        assert record_problem(base) is None and schema_accepts(base), event
        for name, types in PAYLOAD_TYPES[event].items():
            bad = {**base, "data": {**data, name: wrong[types[-1]]}}
            assert record_problem(bad) is not None, (event, name)
            assert not schema_accepts(bad), (event, name)
        for name, types in ENVELOPE_TYPES.items():
            bad = {**base, name: wrong[types[-1]]}
            assert record_problem(bad) is not None, name
            assert not schema_accepts(bad), name


def test_the_envelope_is_named_alike_everywhere_and_what_hooks_need_is_required() -> None:
    """fields.py (the readers' rules), record.py (the typed record and its defaults),
    events.py and schema.py (validate's) name the same envelope; a field a reader fills with
    a value that means nothing (None) and a payload field a record cannot be acted on
    without are ones the schema requires."""
    from journal.record.events import ENVELOPE_FIELDS
    from journal.record.fields import ENVELOPE_TYPES, NEEDED, UNDEFAULTED
    from journal.record.record import ENVELOPE_DEFAULTS, Record
    from journal.record.schema import PAYLOAD_MODELS, RecordModel

    envelope = {"seq", "event", "data", *ENVELOPE_TYPES}
    assert envelope == set(ENVELOPE_FIELDS) == set(RecordModel.model_fields)
    assert envelope == set(Record.__annotations__)
    assert set(ENVELOPE_DEFAULTS) == set(ENVELOPE_TYPES)
    required = {n for n, info in RecordModel.model_fields.items() if info.is_required()}
    assert set(UNDEFAULTED) <= required
    for event, names in NEEDED.items():
        fields = PAYLOAD_MODELS[event].model_fields
        assert all(fields[n].is_required() for n in names), event


def test_text_from_records_is_shown_never_interpreted(ckpt: Path) -> None:
    """Markup-like text and terminal escapes in a record are printed as text: show does not
    fail on '[/wiki/run]', '[bold]' is not eaten, ESC never reaches the terminal."""
    ck = str(ckpt / "checkpoints/step-000004")
    note = "see [/wiki/run] and [bold]this[/bold]"
    evil = "\x1b]0;pwned\x07\x1b[2J\u202eevil"
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}, "total_steps": 4})
        w.append("save", {"checkpoint_path": ck}, step=4)
        metrics = {"accuracy": 0.5, "note": note}
        w.append("report", {"id": "r", "checkpoint_path": ck, "metrics": metrics}, step=4)
        w.append("control", {"command": "stop", "id": "c", "accepted": True, "reason": evil})
        w.append("train_end", {"status": "stopped", "reason": evil}, step=4)
    for args in (["show"], ["show", "--last", "3"], ["tail", "-n", "3"], ["status"]):
        proc = cli("ilab-journal", *args, str(ckpt))
        assert proc.returncode in (0, 4), (args, proc.stderr)  # 4: status of a stopped run
        assert (
            "\x1b" not in proc.stdout
            and "\x07" not in proc.stdout
            and "\u202e" not in (proc.stdout)
        ), args
        assert "\\x1b]0;pwned\\x07" in proc.stdout, args  # shown, as escapes
    table = cli("ilab-journal", "show", str(ckpt), "-e", "report").stdout
    assert note in table  # verbatim: no markup error, nothing eaten
    # Scripts get the value exactly as recorded (stdout is a pipe here).
    raw = cli("ilab-journal", "query", str(ckpt), "--event", "control", "--field", "reason")
    assert raw.stdout == evil + "\n"


def test_the_live_view_prints_record_text_as_text(ckpt: Path) -> None:
    """``tail -f`` on a terminal (rich's live view): markup-like text in a record neither
    stops the view nor changes it; escapes from the record are shown, not sent."""
    import pty

    write_run(ckpt, steps=2, end=None)
    with JournalWriter(ckpt, resume=True) as w:
        reason = "[/wiki/run] \x1b]0;pwned\x07"
        w.append("control", {"command": "stop", "id": "c", "accepted": True, "reason": reason})
        w.append("train_end", {"status": "completed", "reason": reason}, step=2)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [str(BIN / "ilab-journal"), "tail", "-f", str(ckpt), "--interval", "0.05"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env={**os.environ, "COLUMNS": "200", "TERM": "xterm"},
    )
    os.close(follower)
    out = b""
    try:
        while True:  # until the pty closes: the process has ended
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: no writer left
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=30) == 0, out[-2000:]
    finally:
        proc.kill()
        os.close(leader)
    text = out.decode(errors="replace")
    assert "Traceback" not in text and "[/wiki/run]" in text
    assert "\x1b]0;pwned" not in text and "\\x1b]0;pwned" in text


def test_an_unknown_event_name_is_a_usage_error(ckpt: Path) -> None:
    write_run(ckpt, steps=2)
    with JournalWriter(ckpt, resume=True) as w:  # a newer writer's event is not a typo
        w.append("future_event", {"x": 1}, step=2)
    d = str(ckpt)
    for args in (
        ["query", d, "--event", "savee"],
        ["show", d, "-e", "savee"],
        ["show", d, "-e", "savee", "--last", "2"],
        ["show", d, "-e", "savee", "--since-step", "0"],
    ):
        proc = cli("ilab-journal", *args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        assert "unknown event 'savee'" in proc.stderr and "did you mean 'save'" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    # a known event without records is still "no match" (exit 1), not a usage error
    assert cli("ilab-journal", "query", d, "--event", "evaluate").returncode == 1
    future = cli("ilab-journal", "query", d, "--event", "future_event", "--field", "x")
    assert future.returncode == 0 and future.stdout.strip() == "1"
    shown = cli("ilab-journal", "show", d, "-e", "future_event", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["event"] == "future_event"


def test_tail_follow_waits_for_a_run_dir_that_does_not_exist_yet(tmp_path: Path) -> None:
    ckpt = tmp_path / "later"
    proc = subprocess.Popen(
        [str(BIN / "ilab-journal"), "tail", "-f", str(ckpt), "--json", "--interval", "0.05"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # said before it starts waiting
        assert line.startswith(f"waiting for {ckpt / 'journal.jsonl'}"), line
        write_run(ckpt, steps=2)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err  # the status code of the run it followed: completed
    assert "Traceback" not in err
    assert [json.loads(x)["event"] for x in out.splitlines()][-1] == "train_end"


def test_status_says_starting_while_the_launcher_holds_a_dir_without_records(
    ckpt: Path,
) -> None:
    lock = RunLock(ckpt, run_id="abc123")
    assert lock.try_acquire()
    try:
        for make in (lambda: None, lambda: (ckpt / "journal.jsonl").write_bytes(b"")):
            make()
            proc = cli("ilab-journal", "status", str(ckpt))
            assert proc.returncode == 3, proc.stderr  # as running: the run is under way
            first = proc.stdout.splitlines()[0]
            assert f"starting (held by launcher pid {os.getpid()}" in first, proc.stdout
            js = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
            assert js["state"] == "starting" and js["holder"]["pid"] == os.getpid()
    finally:
        lock.release()
    (ckpt / "journal.jsonl").unlink()
    gone = cli("ilab-journal", "status", str(ckpt))  # nobody holds it: not a run (yet)
    assert gone.returncode == 2 and "not started yet" in gone.stderr


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
