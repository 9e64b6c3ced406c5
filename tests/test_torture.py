"""Long torture and soak variants (marked slow: `make test-all`). The default suite runs
bounded versions of the same properties in test_journal_reader.py and test_watcher.py."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal import JournalReader, JournalWriter, read_all
from tests.helpers import records_st
from watcher import Hook, HookOptions, Watcher

pytestmark = pytest.mark.slow


@settings(
    max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(recs=records_st, seed=st.integers(0, 2**32 - 1))
def test_torture_random_corruption_never_yields_a_bad_record(tmp_path_factory, recs, seed) -> None:
    path = tmp_path_factory.mktemp("t") / "journal.jsonl"
    with JournalWriter(path) as w:
        for ev, data, step in recs:
            w.append(ev, data, step=step)
    written = read_all(path).records
    raw = bytearray(path.read_bytes())
    rng = random.Random(seed)
    ops = rng.randint(1, 8)
    for _ in range(ops):  # flip, delete or insert random bytes
        if not raw:
            break
        i = rng.randrange(len(raw))
        op = rng.choice(("flip", "del", "ins"))
        if op == "flip":
            raw[i] = rng.randrange(256)
        elif op == "del":
            del raw[i]
        else:
            raw.insert(i, rng.randrange(256))
    path.write_bytes(bytes(raw))
    batch = JournalReader(path).read(final=True)
    allowed = {(r["seq"], r["event"]) for r in written}
    for rec in batch.records:  # corruption may produce other valid JSON; never a non-record
        assert (
            isinstance(rec, dict) and isinstance(rec["seq"], int) and isinstance(rec["event"], str)
        )
    assert batch.offset == len(raw)
    # One corrupted byte spoils at most two records (a lost newline merges two lines).
    assert (
        len([r for r in batch.records if (r["seq"], r["event"]) in allowed])
        >= len(written) - 2 * ops
    )


def test_soak_watcher_under_a_fast_concurrent_writer(tmp_path: Path) -> None:
    """50k records written while the watcher follows: every save delivered once, in order;
    high-rate hooks coalesce but always see the newest record."""
    path = tmp_path / "journal.jsonl"
    saves: list[int] = []
    last_log: list[int] = []

    def on_save(event, **kw) -> None:
        saves.append(event.seq)

    def on_log(event, **kw) -> None:
        last_log.append(event.seq)
        time.sleep(0.0005)

    hooks = [Hook("save", on_save, HookOptions()), Hook("log", on_log, HookOptions())]
    w = Watcher(path, hooks, persist_cursor=False)
    t = threading.Thread(target=w.run)
    t.start()
    expected: list[int] = []
    log_seqs: list[int] = []
    with JournalWriter(path) as jw:
        for i in range(50_000):
            if i % 500 == 0:
                expected.append(jw.append("save", {"checkpoint_path": f"/c/{i}"}, step=i))
            else:
                log_seqs.append(jw.append("log", {"loss": 1.0}, step=i))
            if i % 5000 == 0:
                os.sched_yield()
        jw.append("train_end", {"status": "completed"})
    t.join(120)
    assert not t.is_alive()
    assert saves == expected
    assert last_log[-1] == log_seqs[-1] and last_log == sorted(last_log)
