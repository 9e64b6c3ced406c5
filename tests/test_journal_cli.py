"""ilab-journal CLI through real subprocesses: every command and its error paths."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import orjson
import pytest

from journal import JournalWriter, read_all
from journal.rundir.paths import ckpt_dir_of, resolve_journal
from tests.helpers import cli, write_run


def test_status_completed_and_json(ckpt: Path) -> None:
    write_run(ckpt, steps=10)
    proc = cli("ilab-journal", "status", str(ckpt))
    assert proc.returncode == 0, proc.stderr
    assert "completed" in proc.stdout and "step-000010" in proc.stdout
    js = json.loads(cli("ilab-journal", "status", str(ckpt), "--json").stdout)
    assert js["state"] == "completed" and js["last_step"] == 10 and js["total_steps"] == 10
    assert js["last_checkpoint"].endswith("checkpoints/step-000010")
    assert js["last_loss"] == pytest.approx(0.2)


@pytest.mark.parametrize(("end", "code"), [("failed", 1), ("stopped", 4), ("interrupted", 5)])
def test_status_exit_code_per_state(ckpt: Path, end: str, code: int) -> None:
    write_run(ckpt, steps=2, end=end)
    proc = cli("ilab-journal", "status", str(ckpt / "journal.jsonl"), "--json")
    assert proc.returncode == code
    assert json.loads(proc.stdout)["state"] == end


def test_status_running_stale_and_resumed(ckpt: Path) -> None:
    write_run(ckpt, steps=2, end=None)
    assert cli("ilab-journal", "status", str(ckpt)).returncode == 3  # running
    proc = cli("ilab-journal", "status", str(ckpt), "--stale-after", "0.01", "--json")
    assert proc.returncode == 6 and json.loads(proc.stdout)["state"] == "stale"
    # A resume after an interruption is running again, with attempt 2.
    ck2 = ckpt.parent / "ck2"
    write_run(ck2, steps=2, end="interrupted")
    write_run(ck2, steps=2, end=None, resume=True)
    js = json.loads(cli("ilab-journal", "status", str(ck2), "--json").stdout)
    assert js["state"] == "running" and js["attempt"] == 2


def test_status_stale_when_trainer_pid_is_gone(ckpt: Path) -> None:
    import socket
    import subprocess
    import sys

    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    with JournalWriter(ckpt) as w:
        w.append(
            "train_begin", {"hostname": socket.gethostname(), "pid": int(dead), "total_steps": 5}
        )
    proc = cli("ilab-journal", "status", str(ckpt), "--json")
    assert proc.returncode == 6 and "gone" in json.loads(proc.stdout)["reason"]


def test_empty_journal(ckpt: Path) -> None:
    (ckpt / "journal.jsonl").write_bytes(b"")
    assert cli("ilab-journal", "status", str(ckpt)).returncode == 7


@pytest.mark.parametrize("cmd", ["status", "show", "stats", "validate", "query", "tail", "plot"])
def test_user_errors_are_one_line_exit_2(tmp_path: Path, cmd: str) -> None:
    extra = ["--event", "save"] if cmd == "query" else []
    not_journal = tmp_path / "notes.txt"
    not_journal.write_text("hello\nworld\n")
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    for target in (tmp_path / "missing", empty_dir, not_journal):
        if cmd in ("query", "tail", "plot") and target == not_journal:
            continue  # these never parse a non-journal fully: covered below
        proc = cli("ilab-journal", cmd, str(target), *extra)
        assert proc.returncode == 2, (cmd, target, proc.stdout, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_journal_that_is_a_directory_is_a_clear_error(ckpt: Path) -> None:
    (ckpt / "journal.jsonl").mkdir()
    proc = cli("ilab-journal", "status", str(ckpt))
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_unreadable_journal_is_a_clear_error(ckpt: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root can read anything; permission bits cannot be exercised")
    write_run(ckpt)
    (ckpt / "journal.jsonl").chmod(0)
    proc = cli("ilab-journal", "status", str(ckpt))
    assert proc.returncode == 2 and "permission denied" in proc.stderr


def test_show_filters_table_and_json(ckpt: Path) -> None:
    write_run(ckpt, steps=10, save_every=3)
    proc = cli("ilab-journal", "show", str(ckpt), "--event", "save", "--json")
    recs = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["step"] for r in recs] == [3, 6, 9]
    proc = cli(
        "ilab-journal",
        "show",
        str(ckpt),
        "-e",
        "save",
        "-e",
        "train_end",
        "--since-step",
        "6",
        "--last",
        "2",
        "--json",
    )
    assert [(r["event"], r["step"]) for r in map(json.loads, proc.stdout.splitlines())] == [
        ("save", 9),
        ("train_end", 10),
    ]
    table = cli("ilab-journal", "show", str(ckpt), "--event", "log", "--last", "1").stdout
    assert "loss=0.2" in table and "event" in table.splitlines()[0]


@pytest.mark.parametrize(
    "args",
    [
        ["{run}", "-e", "save", "train_end"],  # as docs/cli.md writes it: [-e EVENT ...]
        ["{run}", "-e", "save", "-e", "train_end"],
        ["-e", "save", "train_end", "{run}"],  # DIR after the events
        ["{run}", "--event=save", "train_end", "--since-step", "6"],
        ["-e", "save", "train_end", "{run}", "--last", "3"],
    ],
)
def test_show_takes_several_events_after_one_flag(ckpt: Path, args: list[str]) -> None:
    write_run(ckpt, steps=10, save_every=3)
    argv = [a.format(run=ckpt) for a in args]
    proc = cli("ilab-journal", "show", *argv, "--json")
    assert proc.returncode == 0, proc.stderr
    got = [(r["event"], r["step"]) for r in map(json.loads, proc.stdout.splitlines())]
    assert got[-2:] == [("save", 9), ("train_end", 10)]
    assert {e for e, _ in got} == {"save", "train_end"}
    typo = cli("ilab-journal", "show", str(ckpt), "-e", "save", "tarin_end")
    assert typo.returncode == 2 and "did you mean 'train_end'" in typo.stderr


def test_the_readme_status_comment_names_the_codes_its_example_gives() -> None:
    """The README's example stops the run (``control stop``): its ``status`` comment names
    that exit code (4 stopped) and only codes ``status`` gives."""
    from journal.views.summary import STATE_EXIT_CODES
    from tests.helpers import ROOT

    lines = (ROOT / "README.md").read_text().splitlines()
    [comment] = [line.split("#", 1)[1] for line in lines if "ilab-journal status runs/x;" in line]
    named = dict(re.findall(r"(\d) (\w+)", comment))
    assert "control stop runs/x" in "\n".join(lines)
    assert named["4"] == "stopped", comment
    assert all(STATE_EXIT_CODES[state] == int(code) for code, state in named.items()), comment


def test_show_warns_on_invalid_lines_and_keeps_going(ckpt: Path) -> None:
    write_run(ckpt, steps=2)
    path = ckpt / "journal.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines.insert(2, b"garbage{\n")
    path.write_bytes(b"".join(lines))
    proc = cli("ilab-journal", "show", str(ckpt), "--json")
    assert proc.returncode == 0
    assert f"{path}:3: skipped" in proc.stderr
    assert len(proc.stdout.splitlines()) == len(lines) - 1


def test_query_newest_checkpoint_and_fields(ckpt: Path) -> None:
    write_run(ckpt, steps=10, save_every=5)
    out = cli(
        "ilab-journal", "query", str(ckpt), "--event", "save", "--field", "data.checkpoint_path"
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("step-000010")
    assert (
        cli(
            "ilab-journal",
            "query",
            str(ckpt),
            "--event",
            "save",
            "--first",
            "--field",
            "checkpoint_path",
        )
        .stdout.strip()
        .endswith("step-000005")
    )
    assert (
        cli("ilab-journal", "query", str(ckpt), "--event", "save", "--field", "step").stdout.strip()
        == "10"
    )
    whole = json.loads(cli("ilab-journal", "query", str(ckpt), "--event", "train_end").stdout)
    assert whole["data"]["status"] == "completed"
    none = cli("ilab-journal", "query", str(ckpt), "--event", "evaluate")
    assert none.returncode == 1 and none.stdout == ""
    nofield = cli("ilab-journal", "query", str(ckpt), "--event", "save", "--field", "data.nope")
    assert nofield.returncode == 1 and "no field" in nofield.stderr


def test_query_last_ignores_torn_tail(ckpt: Path) -> None:
    write_run(ckpt, steps=5, save_every=5, end=None)
    with open(ckpt / "journal.jsonl", "ab") as f:
        f.write(b'{"v":1,"seq":77,"event":"save","data":{"checkpoint_path":"/torn"')
    out = cli("ilab-journal", "query", str(ckpt), "--event", "save", "--field", "checkpoint_path")
    assert out.stdout.strip().endswith("step-000005")


def test_stats(ckpt: Path) -> None:
    write_run(ckpt, steps=4, save_every=2)
    js = json.loads(cli("ilab-journal", "stats", str(ckpt), "--json").stdout)
    assert js["counts"]["log"] == 4 and js["counts"]["save"] == 2
    assert js["phases"]["step"]["count"] == 4
    assert js["phases"]["save"]["total_s"] == pytest.approx(0.2)
    assert js["tokens_per_s"] == pytest.approx(1024 / 0.25)
    assert "phases" in cli("ilab-journal", "stats", str(ckpt)).stdout


def test_stats_leave_saves_without_a_duration_out_of_the_time(ckpt: Path) -> None:
    """The HF, Accelerate and Lightning bridges' saves carry ``duration: null``: stats count
    them apart ("no duration") and give no time for them, never 0 s, nor a mean halved by
    them (issue 43)."""
    with JournalWriter(ckpt) as w:
        w.append("train_begin", {"config": {}})
        for step, duration in ((2, None), (4, None), (6, 0.3)):
            path = str(ckpt / f"checkpoint-{step}")
            payload = {"checkpoint_path": path, "kind": ["hf"], "duration": duration}
            w.append("save", payload, step=step)  # as trainer.integrations.hf_trainer writes
            if step == 4:
                w.append("train_end", {"status": "completed"}, step=4)
                bridge = json.loads(cli("ilab-journal", "stats", str(ckpt), "--json").stdout)
                text = cli("ilab-journal", "stats", str(ckpt)).stdout
    save = bridge["phases"]["save"]
    assert save == {"count": 0, "total_s": None, "mean_s": None, "unmeasured": 2}
    phases = text.split("phases:")[1].splitlines()
    [row] = [line.split() for line in phases if line.strip().startswith("save ")]
    assert row == ["save", "0", "n/a", "n/a", "2"] and "no duration" in text
    mixed = json.loads(cli("ilab-journal", "stats", str(ckpt), "--json").stdout)
    assert mixed["phases"]["save"] == {
        "count": 1,
        "total_s": pytest.approx(0.3),
        "mean_s": pytest.approx(0.3),  # not 0.1: the two without a duration are not 0 s
        "unmeasured": 2,
    }


def test_validate_clean_and_corrupt(ckpt: Path) -> None:
    write_run(ckpt, steps=3)
    ok = cli("ilab-journal", "validate", str(ckpt))
    assert ok.returncode == 0 and "OK" in ok.stdout
    path = ckpt / "journal.jsonl"
    recs = read_all(path).records
    bad = dict(recs[2], seq=recs[1]["seq"])  # seq goes backwards
    missing = dict(recs[3])
    del missing["run_id"]
    with open(path, "ab") as f:
        f.write(orjson.dumps(bad) + b"\n" + b"{oops\n" + orjson.dumps(missing) + b"\n")
        f.write(orjson.dumps(dict(recs[0], seq=500)) + b"\n")  # unexplained gap
    proc = cli("ilab-journal", "validate", str(ckpt), "--json")
    assert proc.returncode == 1
    problems = json.loads(proc.stdout)["problems"]
    text = "\n".join(problems)
    assert "not strictly increasing" in text and "invalid JSON" in text
    assert "run_id" in text and "missing with no journal_gap" in text


def test_validate_of_a_journal_corrupt_throughout_keeps_the_first_problems_counts_all(
    ckpt: Path,
) -> None:
    """Memory stays bounded: the first 1000 messages are kept, every problem is counted."""
    from journal.views.validate import KEEP_PROBLEMS

    write_run(ckpt, steps=2)
    with open(ckpt / "journal.jsonl", "ab") as f:
        f.write(b"{oops\n" * (KEEP_PROBLEMS + 500))
    proc = cli("ilab-journal", "validate", str(ckpt), "--json")
    assert proc.returncode == 1
    out = json.loads(proc.stdout)
    assert out["problem_count"] == KEEP_PROBLEMS + 500 and not out["ok"]
    assert len(out["problems"]) == KEEP_PROBLEMS
    assert out["problems"][0].startswith("line ")  # the first ones, in file order
    text = cli("ilab-journal", "validate", str(ckpt))
    assert text.returncode == 1
    assert f"... and {KEEP_PROBLEMS + 450} more" in text.stdout
    assert f"{KEEP_PROBLEMS + 500} problems: CORRUPT" in text.stdout


def test_schema_is_valid_json_schema_and_accepts_records(ckpt: Path) -> None:
    proc = cli("ilab-journal", "schema")
    schema = json.loads(proc.stdout)
    assert schema["$schema"].endswith("2020-12/schema")
    assert {"seq", "run_id", "event", "data"} <= set(schema["properties"])
    jsonschema = pytest.importorskip("jsonschema")
    write_run(ckpt, steps=2)
    for rec in read_all(ckpt / "journal.jsonl").records:
        jsonschema.validate(rec, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**rec, "event": "save", "data": {"kind": ["x"]}}, schema)


def test_control_writes_an_atomic_command_file(ckpt: Path) -> None:
    proc = cli("ilab-journal", "control", "stop", str(ckpt), "--reason", "enough")
    assert proc.returncode == 0
    cid = proc.stdout.strip()
    files = list((ckpt / "control").iterdir())
    assert [f.name for f in files] == [f"{cid}.json"]
    body = json.loads(files[0].read_text())
    assert body["command"] == "stop" and body["id"] == cid and body["reason"] == "enough"
    assert "ts" in body and body["source"]
    bad = cli("ilab-journal", "control", "explode", str(ckpt))
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    missing = cli("ilab-journal", "control", "stop", str(ckpt / "nope"))
    assert missing.returncode == 2 and "no such checkpoint directory" in missing.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["control", "stop", "{target}"],
        ["report", "{target}", "--step", "1", "accuracy=0.5"],
        ["lease", "{target}", "step-000001"],
        ["release", "{target}", "some-id"],
        ["prune", "{target}"],
    ],
)
def test_write_commands_refuse_a_file_or_a_path_through_one(
    tmp_path: Path, argv: list[str]
) -> None:
    """A write command drops files into the run dir: given a file that is not a run's
    journal.jsonl (its directory's journal would be another file) or a path below a file,
    it says so in one line, exit 2, and writes nothing anywhere."""
    notes = tmp_path / "notes.txt"
    notes.write_text("hello\n")
    # (report and prune read the journal first: "no such file or directory" for the second)
    for target, messages in (
        (notes, [f"{notes}: a file, neither a run dir nor its journal.jsonl"]),
        (notes / "run", [f"{notes}/run: {notes} is not a directory", f"{notes}/run: no such"]),
    ):
        proc = cli("ilab-journal", *(a.format(target=target) for a in argv), cwd=tmp_path)
        assert proc.returncode == 2, (target, proc.stdout, proc.stderr)
        line = proc.stderr.strip()
        assert "\n" not in line and any(line.startswith(f"Error: {m}") for m in messages), line
        assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_tail_prints_last_records_and_follow_ends_on_train_end(ckpt: Path) -> None:
    import subprocess
    import sys

    write_run(ckpt, steps=3, end=None)
    out = cli("ilab-journal", "tail", str(ckpt), "-n", "2")
    assert out.returncode == 0 and len(out.stdout.splitlines()) == 2
    follower = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "ilab-journal"),
            "tail",
            str(ckpt),
            "-f",
            "-n",
            "1",
            "--json",
            "--interval",
            "0.05",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        # The follower has printed the newest existing record: it is past its first read.
        assert json.loads(follower.stdout.readline())["event"] == "step_end"
        with JournalWriter(ckpt, resume=False) as w:
            w.append("log", {"loss": 0.5}, step=4)
            w.append("train_end", {"status": "stopped"}, step=4)
        out_text, _ = follower.communicate(timeout=30)
    finally:
        follower.kill()
    assert follower.returncode == 4  # the status code of the final state
    assert [json.loads(x)["event"] for x in out_text.splitlines()] == ["log", "train_end"]


def test_plot_writes_a_png(ckpt: Path) -> None:
    pytest.importorskip("matplotlib")
    write_run(ckpt, steps=5)
    proc = cli("ilab-journal", "plot", str(ckpt), "-o", str(ckpt / "p.png"))
    assert proc.returncode == 0, proc.stderr
    assert (ckpt / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_help_on_every_command() -> None:
    for cmd in [
        "",
        "status",
        "show",
        "tail",
        "query",
        "stats",
        "validate",
        "schema",
        "control",
        "plot",
    ]:
        proc = cli("ilab-journal", *([cmd] if cmd else []), "--help")
        assert proc.returncode == 0 and "Usage" in proc.stdout


@pytest.mark.parametrize(
    ("given", "journal"),
    [
        ("run", "run/journal.jsonl"),  # a run dir
        ("run/journal.jsonl", "run/journal.jsonl"),  # its journal
        ("run/copy.log", "run/copy.log"),  # an existing file, whatever its name
        ("later", "later/journal.jsonl"),  # a run dir that is not there yet
        ("later/other.jsonl", "later/other.jsonl"),  # a journal that is not there yet
    ],
)
def test_a_user_path_names_one_journal_everywhere(tmp_path: Path, given: str, journal: str) -> None:
    """The writer, ``tail -f``, ``ilab-watch`` and the write commands all read a path given
    before the run starts as resolve_journal does: a journal, or the run dir that holds it."""
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "copy.log").write_text("")
    assert resolve_journal(tmp_path / given, must_exist=False) == tmp_path / journal
    assert ckpt_dir_of(tmp_path / given) == (tmp_path / journal).parent


def test_show_puts_a_refusals_verdict_before_its_long_source(tmp_path: Path) -> None:
    """A refused report's control record says accepted=False within show's width, however
    long the source (a hook's command line) that sent it."""
    with JournalWriter(tmp_path / "journal.jsonl") as w:
        w.append("train_begin", {"world_size": 1})
        refused = {"command": None, "id": None, "source": "watcher:x:" + "python eval.py " * 20}
        refused |= {
            "accepted": False,
            "reason": "reports/r1.json refused: bad",
            "applied_at_step": None,
        }
        w.append("control", refused)
    out = cli("ilab-journal", "show", str(tmp_path), "-e", "control", env={"COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "accepted=False" in out.stdout and "reason=reports/r1.json refused" in out.stdout
