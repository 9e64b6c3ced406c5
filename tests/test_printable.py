"""One ``printable`` for every console (journal/record/text.py): terminal escapes and bidi
overrides from a record are shown, never obeyed, by ``ilab-journal show``, ``status``,
``tail -f`` and ``ilab-watch``'s console, through the real console scripts."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest

from journal import JournalWriter
from journal.record.text import printable
from tests.helpers import begin_payload, cli

# A callback's name, a reason and a metric key, each with a terminal escape (ESC ...) and a
# right-to-left override (U+202E), which would reorder what follows it on the screen.
NAME = "cb\x1b[31m\u202eEvil"
REASON = "why\x1b]0;title\x07\u202eNot"
METRIC = "acc\x1b[2J\u202eur"
#: How each is shown: the escapes written out, as ``printable`` writes them.
SHOWN = {
    NAME: "cb\\x1b[31m\\u202eEvil",
    REASON: "why\\x1b]0;title\\x07\\u202eNot",
    METRIC: "acc\\x1b[2J\\u202eur",
}
#: Characters that must never reach a terminal raw from a record.
RAW = ("\x1b", "\x07", "\u202e")


def _write_journal(ckpt: Path) -> None:
    """A finished run whose control record names a callback (its source) with a reason, whose
    report has the metric key, and whose failed train_end has the reason."""
    with JournalWriter(ckpt, run_id="bidi") as w:
        w.append("train_begin", begin_payload(2), step=0)
        w.append("log", {"loss": 1.0, "lr": 1e-4}, step=1)
        w.append(
            "control",
            {"command": "stop", "source": NAME, "reason": REASON, "id": "c1", "accepted": False},
            step=1,
        )
        w.append(
            "report",
            {
                "id": "r1",
                "checkpoint_path": str(ckpt / "step-2"),
                "step": 2,
                "metrics": {METRIC: 0.5},
            },
            step=2,
        )
        w.append("train_end", {"status": "failed", "reason": REASON}, step=2)


def _assert_escaped(output: str, *texts: str) -> None:
    """No raw control or bidi character in ``output``; each of ``texts`` there, escaped."""
    raw = [f"U+{ord(c):04X}" for c in RAW if c in output]
    assert not raw, f"raw {raw} reached the console:\n{output!r}"
    for text in texts:
        assert SHOWN[text] in output, f"{SHOWN[text]!r} not in:\n{output}"


@pytest.fixture
def run_dir(ckpt: Path) -> Path:
    _write_journal(ckpt)
    return ckpt


def test_show_escapes_the_callback_name_reason_and_metric(run_dir: Path) -> None:
    proc = cli("ilab-journal", "show", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    _assert_escaped(proc.stdout + proc.stderr, NAME, REASON, METRIC)


def test_status_escapes_the_reason_and_metric(run_dir: Path) -> None:
    proc = cli("ilab-journal", "status", str(run_dir))
    assert proc.returncode == 1, proc.stderr  # failed
    _assert_escaped(proc.stdout + proc.stderr, REASON, METRIC)


def test_tail_follow_escapes_every_record_line(run_dir: Path) -> None:
    proc = cli("ilab-journal", "tail", "-f", str(run_dir))  # ends at the train_end
    assert proc.returncode == 1, proc.stderr  # the failed state's code
    _assert_escaped(proc.stdout + proc.stderr, NAME, REASON, METRIC)


#: A Python callback named (``callback_label``) with the escapes, whose failures quote the
#: record's reason and metric keys: ilab-watch prints its label and its error.
EVIL_CALLBACK = f"""\
class Evil:
    callback_label = {NAME!r}

    def on_report(self, event, **data):
        raise RuntimeError("bad metrics " + " ".join(data["metrics"]))

    def on_train_end(self, event, **data):
        raise RuntimeError("ended: " + data["reason"])
"""

#: A command that fails, saying its argument on stderr: its label (the command line) and
#: its last stderr line carry the callback's name.
FAIL_COMMAND = "import sys; print(sys.argv[1], file=sys.stderr); sys.exit(3)"


def test_watch_console_escapes_callback_names_and_errors(run_dir: Path, tmp_path: Path) -> None:
    """The console lines naming a failing command and a failing Python callback, and the
    watcher's log lines (the callback's traceback), escape the record's characters."""
    cb = tmp_path / "evil_cb.py"
    cb.write_text(EVIL_CALLBACK)
    fail = tmp_path / "fail.py"
    fail.write_text(FAIL_COMMAND)
    command = f"{sys.executable} {fail} '{NAME}'"
    proc = cli(
        "ilab-watch", str(run_dir), "--replay", "--on-log", command, "--callback", f"{cb}:Evil"
    )
    assert proc.returncode == 1, proc.stderr  # deliveries failed
    _assert_escaped(proc.stdout + proc.stderr, NAME, REASON, METRIC)
    failures = [ln for ln in proc.stderr.splitlines() if ln.startswith("✗")]
    named = [ln for ln in failures if SHOWN[NAME] in ln]
    assert len(named) >= 3, proc.stderr  # the command's line, on_report's and on_train_end's


def test_watch_refuses_a_cursor_name_that_is_not_one_plain_word(run_dir: Path) -> None:
    """``--name`` names the cursor's files and is printed: a bidi override, a control
    character or a separator in it is one line and exit 2, and no file gets that name."""
    for bad in ("ev\u202eil", "a\x1b[31m", "../up", "a/b", ".hidden", ""):
        proc = cli("ilab-watch", str(run_dir), "--replay", "--on-log", "true", "--name", bad)
        assert proc.returncode == 2, (bad, proc.stderr)
        assert "Traceback" not in proc.stderr and "--name" in proc.stderr
        _assert_escaped(proc.stderr)
    assert not (run_dir / "watch").exists() or all(
        p.name.isascii() and not p.name.startswith(".") for p in (run_dir / "watch").iterdir()
    )


@pytest.mark.parametrize(
    ("char", "shown"),
    [
        ("\x1b", "\\x1b"),
        ("\x00", "\\x00"),
        ("\x07", "\\x07"),
        ("\r", "\\x0d"),
        ("\x7f", "\\x7f"),
        ("\x9b", "\\x9b"),  # C1 CSI
        *((chr(c), f"\\u{c:04x}") for c in range(0x202A, 0x202F)),  # embeddings, overrides
        *((chr(c), f"\\u{c:04x}") for c in range(0x2066, 0x206A)),  # isolates
        ("\u200e", "\\u200e"),
        ("\u200f", "\\u200f"),
        ("\u061c", "\\u061c"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ],
)
def test_printable_escapes_controls_and_bidi_marks(char: str, shown: str) -> None:
    assert printable(f"a{char}b") == f"a{shown}b"
    assert printable(f"a{char}b", newlines=True) == f"a{shown}b"


def test_printable_keeps_text_and_newlines_only_when_asked() -> None:
    assert printable("loss=0.5 é 中 ✓ [red]x[/red]") == "loss=0.5 é 中 ✓ [red]x[/red]"
    assert printable("a\nb\tc") == "a\\x0ab\\x09c"
    assert printable("a\nb\tc\x1b", newlines=True) == "a\nb\tc\\x1b"


def test_every_console_uses_the_one_printable() -> None:
    """The journal CLI, the channels, the watcher and the trainer print through the same
    function; the watcher's old copy (no bidi escapes) is gone."""
    users = [
        "journal.cli.format",
        "journal.record.numbers",  # the values an option error quotes (journal/cli/common.py)
        "journal.cli.scan",  # validate's findings (the group and status print none)
        "journal.cli.read",
        "journal.cli.tail",
        "journal.channels.control",
        "watcher.engine.console",
        "watcher.hooks.hook",
        "trainer.steering.control_poller",
    ]
    for name in users:
        assert importlib.import_module(name).printable is printable, name
    assert importlib.util.find_spec("watcher.engine.text") is None
    assert importlib.util.find_spec("watcher.text") is None
