"""Order for one callback object (issue 35): its methods are called one at a time, in journal
order, on one queue; separate objects stay independent; what a coalesced on_log sees."""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from journal import read_all
from journal.read.cursor import START
from journal.record.record import complete as record_of
from journal.rundir.paths import journal_path
from tests.helpers import COUNT_CALLBACK, cli, wait_for, write_log_journal
from watcher.engine.engine import Watcher
from watcher.engine.queues import HookQueue
from watcher.hooks.contract import CallbackShape
from watcher.hooks.delivery import Batch, Delivery, DeliveryResult
from watcher.hooks.hook import Hook, HookOptions, hooks_for_object

N_LOGS = 2000


def write_logs(ckpt: Path, n: int = N_LOGS) -> None:
    write_log_journal(ckpt, n, run_id="order")


class Seqs:
    """Records the seq of every call, with the event. ``gate`` (if set) holds every
    ``on_log``; ``hold_first_log`` holds only the first one (the others pile up behind it);
    ``held`` is set once an ``on_log`` waits at either."""

    def __init__(
        self,
        gate: threading.Event | None = None,
        hold_first_log: threading.Event | None = None,
    ) -> None:
        self.calls: list[tuple[str, int]] = []
        self.gate = gate
        self.hold_first_log = hold_first_log
        self.held = threading.Event()
        self.ended = threading.Event()

    def on_train_begin(self, event: Any, **data: Any) -> None:
        self.calls.append(("train_begin", event.seq))

    def on_log(self, event: Any, **data: Any) -> None:
        gate = self.gate or self.hold_first_log
        if gate is not None:
            self.held.set()
            assert gate.wait(60)
            self.hold_first_log = None
        self.calls.append(("log", event.seq))

    def on_train_end(self, event: Any, **data: Any) -> None:
        self.calls.append(("train_end", event.seq))
        self.ended.set()


def replay(ckpt: Path, hooks: list[Hook]) -> Watcher:
    return Watcher(journal_path(ckpt), hooks, follow=False, state_dir=None)


def test_replay_subprocess_calls_on_train_end_after_every_on_log(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    write_logs(ckpt)
    out = tmp_path / "seen.json"
    (tmp_path / "cb.py").write_text(COUNT_CALLBACK.format(out=str(out)))
    proc = cli(
        "ilab-watch",
        str(ckpt),
        "--callback",
        f"{tmp_path / 'cb.py'}:Count",
        "--queue",
        "log=all",
        "--replay",
        "-q",
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(out.read_text())
    assert (seen["seen_at_end"], seen["on_log"], seen["late"]) == (N_LOGS, N_LOGS, 0)


def test_replay_in_process_calls_one_objects_methods_in_journal_order(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    write_logs(ckpt)
    obj = Seqs()
    w = replay(ckpt, hooks_for_object(obj, lambda ev: HookOptions(queue="all")))
    assert w.run() == 0
    seqs = [s for _, s in obj.calls]
    assert seqs == sorted(seqs) == [r["seq"] for r in read_all(journal_path(ckpt)).records]
    assert obj.calls[-1][0] == "train_end" and len(obj.calls) == N_LOGS + 2


def test_a_slow_object_does_not_delay_another(tmp_path: Path) -> None:
    ckpt = tmp_path / "run"
    write_logs(ckpt, n=50)
    gate = threading.Event()
    slow, fast = Seqs(gate=gate), Seqs()
    every = lambda ev: HookOptions(queue="all")  # noqa: E731
    w = replay(ckpt, hooks_for_object(slow, every) + hooks_for_object(fast, every))
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        assert slow.held.wait(60)  # slow is held at its first log...
        assert fast.ended.wait(60)  # ...and fast runs to its end all the same
        assert [e for e, _ in slow.calls] == ["train_begin"]
        assert len(fast.calls) == 52
    finally:
        gate.set()
    t.join(60)
    assert not t.is_alive()
    assert [e for e, _ in slow.calls] == ["train_begin"] + ["log"] * 50 + ["train_end"]


def test_coalesced_on_log_never_reaches_across_train_end(tmp_path: Path) -> None:
    """The default ``latest`` policy for ``log``: the object sees a subset of its log records,
    in journal order, the newest one before ``train_end`` included, then ``train_end``."""
    ckpt = tmp_path / "run"
    write_logs(ckpt)
    release = threading.Event()
    obj = Seqs(hold_first_log=release)
    w = replay(ckpt, hooks_for_object(obj, lambda ev: HookOptions()))
    code: list[int] = []
    t = threading.Thread(target=lambda: code.append(w.run()), daemon=True)
    t.start()
    try:  # the first log is held until later ones were coalesced behind it
        assert obj.held.wait(60)
        wait_for(lambda: w.count("coalesced"), 60, "a coalesced log")
    finally:
        release.set()
    t.join(60)
    assert code == [0]
    records = read_all(journal_path(ckpt)).records
    seqs = [s for _, s in obj.calls]
    assert seqs == sorted(seqs)
    assert obj.calls[-2:] == [("log", records[-2]["seq"]), ("train_end", records[-1]["seq"])]
    label = f"{type(obj).__module__}.{type(obj).__qualname__}.on_log"
    statuses = {st: n for (hook, ev, st), n in w.completions.tally.items() if hook == label}
    assert statuses["ok"] == len(seqs) - 2 and sum(statuses.values()) == N_LOGS
    assert statuses["coalesced"] > 0


def _hook(event: str, policy: str, owner: CallbackShape) -> Hook:
    return Hook(event, lambda e, **kw: None, HookOptions(queue=policy), owner=owner)  # type: ignore[arg-type]


def test_coalescing_in_an_objects_queue_keeps_order_across_events() -> None:
    """A pending ``latest`` delivery is replaced by a newer one of its hook, across other
    ``latest`` ones, never across a pending ``all`` one."""
    owner = CallbackShape(object())  # one object's hooks: one ordered queue
    log_h, step_h, save_h = (
        _hook("log", "latest", owner),
        _hook("step_end", "latest", owner),
        _hook("save", "all", owner),
    )
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []
    done: dict[str, str] = {}

    def deliver(d: Delivery) -> DeliveryResult:
        started.set()
        assert release.wait(30)
        ran.append(d.delivery_id)
        return DeliveryResult.of(d, "ok")

    def complete(finished: Sequence[tuple[Delivery, DeliveryResult]], *_: object) -> None:
        done.update((d.delivery_id, out.status) for d, out in finished)

    q = HookQueue([log_h, step_h, save_h], deliver, complete)
    batch = Batch(START, 0, 99)

    def submit(hook: Hook, name: str) -> None:
        q.submit_many([Delivery(hook, record_of({"seq": len(done) + len(ran)}), batch, name)])

    submit(log_h, "log1")
    assert started.wait(30)  # log1 runs; the rest queue behind it
    for hook, name in [
        (log_h, "log2"),
        (step_h, "step2"),
        (log_h, "log3"),  # replaces log2 (only step2, also latest, is behind it)
        (save_h, "save3"),
        (log_h, "log4"),  # save3 is pending before it: log3 stays
        (log_h, "log5"),  # replaces log4
    ]:
        submit(hook, name)
    release.set()
    wait_for(lambda: q.idle() and len(done) == 7, timeout=30, what="the queue to drain")
    q.close()
    assert ran == ["log1", "step2", "log3", "save3", "log5"]
    assert {k for k, v in done.items() if v == "coalesced"} == {"log2", "log4"}


@pytest.mark.parametrize("policy", ["latest", "all"])
def test_a_lone_hook_keeps_its_policy(policy: str) -> None:
    """A callable given alone (not an object's method) is its own queue, as before."""
    hook = Hook("log", lambda e, **kw: None, HookOptions(queue=policy))  # type: ignore[arg-type]
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def deliver(d: Delivery) -> DeliveryResult:
        started.set()
        assert release.wait(30)
        ran.append(d.delivery_id)
        return DeliveryResult.of(d, "ok")

    q = HookQueue([hook], deliver, lambda *_: None)
    batch = Batch(START, 0, 9)
    q.submit_many([Delivery(hook, record_of({"seq": 1}), batch, "a")])
    assert started.wait(30)
    for i, name in enumerate("bcd", start=2):
        q.submit_many([Delivery(hook, record_of({"seq": i}), batch, name)])
    release.set()
    wait_for(q.idle, timeout=30, what="the queue to drain")
    q.close()
    assert ran == (["a", "d"] if policy == "latest" else ["a", "b", "c", "d"])
