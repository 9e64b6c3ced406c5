"""The dispatch engine behind ``ilab-watch`` and the embedded watcher of ``run_training``.

Reads journal records from a durable cursor, turns each (record, hook) pair into a delivery,
and runs deliveries on per-hook worker threads with timeouts, retries, a concurrency limit
and a queue policy. Delivery is at-least-once per (event, hook): the cursor only moves past
a record once every delivery of it has completed (or was coalesced away by a ``latest``
queue), and completed deliveries are remembered so a restart does not repeat them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from journal.control import Control, send_command
from journal.events import MICROBATCH_EVENTS
from journal.reader import JournalReader, end_of_complete_lines
from watcher.callbacks import CommandTarget, Event, callable_name
from watcher.cursor import Cursor, CursorState
from watcher.tail import Waker

log = logging.getLogger("watcher")

QueuePolicy = Literal["all", "latest"]
#: Events that can fire many times a second: by default only the newest pending one runs.
HIGH_RATE_EVENTS = frozenset(
    {"step_begin", "step_end", "log", "before_optimizer_step", "after_optimizer_step"}
    | MICROBATCH_EVENTS
)
TAIL_BYTES = 2000
SAFETY_POLL_S = 1.0


@dataclass
class HookOptions:
    timeout: float | None = None  # seconds; None: commands 3600, callables unlimited
    retries: int = 0
    backoff: float = 1.0  # first retry delay; doubles each time, capped at 60 s
    concurrency: int = 1
    queue: QueuePolicy | None = None  # None: "latest" for high-rate events, else "all"


@dataclass
class Hook:
    """One callback bound to one event."""

    event: str
    target: CommandTarget | Callable[..., Any]
    options: HookOptions = field(default_factory=HookOptions)
    label: str = ""

    def __post_init__(self) -> None:
        if not self.label:
            self.label = (
                self.target.spec
                if isinstance(self.target, CommandTarget)
                else callable_name(self.target)
            )
        if self.options.queue is None:
            self.options.queue = "latest" if self.event in HIGH_RATE_EVENTS else "all"

    @property
    def id(self) -> str:
        """Stable identity (cursor key): the event and what runs."""
        return f"{self.event}:{self.label}"

    @property
    def short_id(self) -> str:
        return hashlib.sha1(self.id.encode()).hexdigest()[:8]


@dataclass
class Outcome:
    """The recorded result of one delivery (one line of the results file)."""

    delivery_id: str
    hook: str
    event: str
    seq: int
    step: int
    status: str  # ok | failed | timeout | coalesced | abandoned
    attempts: int = 0
    start_ts: float | None = None
    end_ts: float | None = None
    duration: float | None = None
    exit_code: int | None = None
    error: str | None = None
    stdout_tail: str | None = None
    stderr_tail: str | None = None
    log_path: str | None = None
    control: list[str] | None = None

    @property
    def failed(self) -> bool:
        return self.status in ("failed", "timeout", "abandoned")


@dataclass
class _Batch:
    offset: int
    line_no: int
    min_seq: int
    pending: int


@dataclass
class _Delivery:
    hook: Hook
    record: dict[str, Any]
    batch: _Batch
    delivery_id: str


class _HookRunner:
    """A queue and ``concurrency`` worker threads for one hook."""

    def __init__(self, hook: Hook, engine: Watcher) -> None:
        self.hook, self.engine = hook, engine
        self.queue: deque[_Delivery] = deque()
        self.cond = threading.Condition()
        self.running = 0
        self.closed = False
        self.threads = [
            threading.Thread(target=self._work, name=f"hook-{hook.short_id}-{i}", daemon=True)
            for i in range(max(1, hook.options.concurrency))
        ]
        for t in self.threads:
            t.start()

    def submit(self, d: _Delivery) -> None:
        dropped: list[_Delivery] = []
        with self.cond:
            if self.hook.options.queue == "latest":
                dropped, self.queue = list(self.queue), deque()
            self.queue.append(d)
            self.cond.notify()
        for old in dropped:
            self.engine._complete(
                old,
                Outcome(
                    old.delivery_id,
                    old.hook.label,
                    old.hook.event,
                    old.record["seq"],
                    old.record.get("step", 0),
                    "coalesced",
                ),
            )

    def idle(self) -> bool:
        with self.cond:
            return not self.queue and self.running == 0

    def close(self) -> list[_Delivery]:
        with self.cond:
            self.closed = True
            left, self.queue = list(self.queue), deque()
            self.cond.notify_all()
        return left

    def _work(self) -> None:
        while True:
            with self.cond:
                while not self.queue and not self.closed:
                    self.cond.wait()
                if self.closed:
                    return
                d = self.queue.popleft()
                self.running += 1
            try:
                out = self.engine._deliver(d)
            except Exception as exc:
                out = Outcome(
                    d.delivery_id,
                    d.hook.label,
                    d.hook.event,
                    d.record["seq"],
                    d.record.get("step", 0),
                    "failed",
                    error=f"internal error: {exc!r}",
                )
            try:
                self.engine._complete(d, out)
            finally:
                with self.cond:  # idle only once the completion (and cursor) is recorded
                    self.running -= 1


class Watcher:
    """Tail a journal and deliver its records to hooks. ``run()`` blocks; see its docstring."""

    def __init__(
        self,
        journal: Path,
        hooks: list[Hook],
        *,
        name: str = "watch",
        state_dir: Path | None = None,
        start: Literal["cursor", "start"] | int = "cursor",
        begin: Literal["start", "now"] = "start",
        replay: bool = False,
        poll: float | None = None,
        persist_cursor: bool = True,
        reporter: Callable[[Outcome], None] | None = None,
        history_consumers: list[Any] | None = None,
        control_source: str | None = None,
    ) -> None:
        self.journal = journal
        self.ckpt_dir = str(journal.parent)
        self.hooks = hooks
        self.name = name
        self.state_dir = state_dir
        self.replay_mode = replay
        self.reporter = reporter
        self.history_consumers = history_consumers or []
        self.control_source = control_source or f"watcher:{name}"
        self.cursor = Cursor(
            state_dir / f"{name}.cursor.json" if state_dir and persist_cursor else None
        )
        self.results_path = state_dir / f"{name}.results.jsonl" if state_dir else None
        self.logs_dir = state_dir / f"{name}.logs" if state_dir else None
        self.waker = Waker(journal, poll=poll)
        self.outcomes: list[Outcome] = []
        self.failed_final = 0
        self.saw_end = False
        self._stop = threading.Event()
        self._final = threading.Event()  # the writer is gone: read to the end, torn tail included
        self._lock = threading.Lock()
        self._batches: deque[_Batch] = deque()
        self._start = start
        self._begin = begin
        self._runners = {id(h): _HookRunner(h, self) for h in hooks}
        self._ident: tuple[int, int] | None = None
        self.state = CursorState()
        self.reader = JournalReader(journal)
        self.notices: list[str] = []

    # -- control from other threads -----------------------------------------------------

    def request_stop(self) -> None:
        self._stop.set()
        self.waker.wake()

    def writer_finished(self) -> None:
        """Tell a follower that no more records will come (run_training after torchrun)."""
        self._final.set()
        self.waker.wake()

    # -- main loop ---------------------------------------------------------------------

    def run(self) -> int:
        """Catch up from the cursor, then follow until ``train_end`` and all its deliveries
        are done (or, with ``replay=True``, until the end of the file). Returns 0 when every
        delivery succeeded, 1 when any finally failed."""
        self.waker.start()
        try:
            self._init_position()
            while not self._stop.is_set():
                self._check_identity()
                final = self.replay_mode or self._final.is_set()
                before, before_line = self.reader.offset, self.reader.line_no
                batch = self.reader.read(final=final)
                for bad in batch.invalid:
                    self._notice(
                        f"{self.journal}:{bad.line_no}: skipped invalid line ({bad.reason})"
                    )
                if batch.records:
                    self._dispatch(batch.records, before, before_line)
                if self._finished(final, progressed=self.reader.offset != before):
                    break
                self.waker.wait(SAFETY_POLL_S)
        finally:
            self._shutdown()
        return 1 if self.failed_final else 0

    def _finished(self, final: bool, progressed: bool) -> bool:
        if progressed:
            return False
        # Nothing new: done once train_end was seen, or the file is final (replay, or the
        # writer is gone), and every delivery has completed.
        return (self.saw_end or final) and all(r.idle() for r in self._runners.values())

    def _init_position(self) -> None:
        saved = self.cursor.load()
        if self.cursor.warning:
            self._notice(self.cursor.warning)
        fp = self._fingerprint()
        if isinstance(self._start, int):  # an explicit offset (the embedded watcher)
            self.state = CursorState(offset=self._start, fingerprint=fp)
        elif self._start == "cursor" and saved is not None:
            if saved.fingerprint and fp and saved.fingerprint != fp:
                self._notice(
                    f"{self.journal} was replaced since the cursor was saved; starting over"
                )
                self.state = CursorState(fingerprint=fp)
            else:
                self.state = saved
                self.state.fingerprint = saved.fingerprint or fp
                if saved.offset:
                    log.info("resuming cursor %s at byte %d", self.cursor.path, saved.offset)
        elif self._start == "cursor" and self._begin == "now":
            self.state = CursorState(offset=end_of_complete_lines(self.journal), fingerprint=fp)
        else:
            self.state = CursorState(fingerprint=fp)
        self.reader = JournalReader(self.journal, self.state.offset, self.state.line_no)
        if self.history_consumers:
            # Everything before the starting point: stateful callbacks rebuild from it.
            history = (
                JournalReader(self.journal).read(max_bytes=self.state.offset).records
                if self.state.offset
                else []
            )
            for obj in self.history_consumers:
                try:
                    obj.replay(history)
                except Exception:
                    log.exception("replay() of %s failed", callable_name(obj))

    def _fingerprint(self) -> str | None:
        try:
            with open(self.journal, "rb") as f:
                first = f.readline(4096)
        except OSError:
            return None
        if not first.endswith(b"\n"):
            return None
        return hashlib.sha1(first).hexdigest()[:16]

    def _check_identity(self) -> None:
        try:
            st = os.stat(self.journal)
        except FileNotFoundError:
            return
        ident = (st.st_dev, st.st_ino)
        replaced = self._ident is not None and ident != self._ident
        self._ident = ident
        truncated = st.st_size < self.reader.offset
        if not (replaced or truncated):
            if self.state.fingerprint is None:
                self.state.fingerprint = self._fingerprint()
            return
        what = "replaced" if replaced else "truncated"
        self._notice(f"{self.journal} was {what}; reading it again from the start")
        with self._lock:
            self._batches.clear()
            self.state = CursorState(fingerprint=self._fingerprint())
        self.saw_end = False
        self.reader = JournalReader(self.journal)

    def _dispatch(self, records: list[dict[str, Any]], offset: int, line_no: int) -> None:
        deliveries: list[tuple[_HookRunner, Hook, dict[str, Any], str]] = []
        for rec in records:
            ev = rec.get("event")
            if ev == "train_end":
                self.saw_end = True
            elif ev == "train_begin":  # a resumed attempt: its predecessor's end is not ours
                self.saw_end = False
            for hook in self.hooks:
                if hook.event != rec.get("event"):
                    continue
                if rec["seq"] in self.state.done.get(hook.id, ()):
                    continue  # completed before a restart
                did = f"{rec.get('run_id', '')}-{rec['seq']}-{hook.short_id}"
                deliveries.append((self._runners[id(hook)], hook, rec, did))
        b = _Batch(offset, line_no, records[0]["seq"], len(deliveries))
        with self._lock:
            self._batches.append(b)
        for runner, hook, rec, did in deliveries:
            runner.submit(_Delivery(hook, rec, b, did))
        if not deliveries:
            self._advance()

    # -- delivery ------------------------------------------------------------------------

    def _deliver(self, d: _Delivery) -> Outcome:
        hook, rec = d.hook, d.record
        opts = hook.options
        out = Outcome(
            d.delivery_id,
            hook.label,
            hook.event,
            rec["seq"],
            rec.get("step", 0),
            "failed",
            start_ts=time.time(),
        )
        for attempt in range(1, opts.retries + 2):
            out.attempts = attempt
            t0 = time.perf_counter()
            if isinstance(hook.target, CommandTarget):
                self._run_command(hook.target, d, out, attempt)
            else:
                self._run_callable(hook.target, d, out)
            out.duration = time.perf_counter() - t0
            if out.status == "ok" or self._stop.is_set():
                break
            if attempt <= opts.retries:
                delay = min(60.0, opts.backoff * 2 ** (attempt - 1))
                if self._stop.wait(delay):
                    break
        out.end_ts = time.time()
        return out

    def _values(self, d: _Delivery) -> dict[str, Any]:
        rec = d.record
        values: dict[str, Any] = {k: v for k, v in (rec.get("data") or {}).items()}
        values.update({k: v for k, v in rec.items() if k != "data"})
        values.update(ckpt_dir=self.ckpt_dir, delivery_id=d.delivery_id, journal=str(self.journal))
        return values

    def _env(self, d: _Delivery, payload: bytes) -> dict[str, str]:
        rec = d.record
        env = dict(os.environ)
        for k, v in (rec.get("data") or {}).items():
            if isinstance(v, (str, int, float, bool)) or v is None:
                env[f"ILAB_{k.upper()}"] = "" if v is None else str(v)
        env.update(
            ILAB_EVENT=str(rec.get("event")),
            ILAB_STEP=str(rec.get("step", 0)),
            ILAB_EPOCH=str(rec.get("epoch", 0)),
            ILAB_RUN_ID=str(rec.get("run_id", "")),
            ILAB_SEQ=str(rec["seq"]),
            ILAB_ATTEMPT=str(rec.get("attempt", 1)),
            ILAB_CKPT_DIR=self.ckpt_dir,
            ILAB_JOURNAL=str(self.journal),
            ILAB_DELIVERY_ID=d.delivery_id,
            ILAB_EVENT_JSON=payload.decode(),
        )
        return env

    def _run_command(self, target: CommandTarget, d: _Delivery, out: Outcome, attempt: int) -> None:
        payload = orjson.dumps(d.record)
        argv = target.render(self._values(d))
        timeout = d.hook.options.timeout if d.hook.options.timeout is not None else 3600.0
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self._env(d, payload),
                start_new_session=True,
                cwd=os.getcwd(),
            )
        except OSError as exc:
            out.status, out.error, out.exit_code = (
                "failed",
                f"cannot start {argv[0]}: {exc.strerror}",
                None,
            )
            return
        try:
            stdout, stderr = proc.communicate(payload, timeout=timeout)
            out.status = "ok" if proc.returncode == 0 else "failed"
            out.error = None if proc.returncode == 0 else f"exit code {proc.returncode}"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            stdout, stderr = proc.communicate()
            out.status, out.error = (
                "timeout",
                f"timed out after {timeout:g}s (process group killed)",
            )
        out.exit_code = proc.returncode
        out.stdout_tail = stdout[-TAIL_BYTES:].decode("utf-8", "replace")
        out.stderr_tail = stderr[-TAIL_BYTES:].decode("utf-8", "replace")
        if self.logs_dir is not None:
            self.logs_dir.mkdir(parents=True, exist_ok=True)
            lp = (
                self.logs_dir
                / f"{d.record['seq']:08d}-{d.hook.event}-{d.hook.short_id}-a{attempt}.log"
            )
            lp.write_bytes(
                b"$ "
                + " ".join(argv).encode()
                + b"\n--- stdout\n"
                + stdout
                + b"\n--- stderr\n"
                + stderr
            )
            out.log_path = str(lp)

    def _run_callable(self, fn: Callable[..., Any], d: _Delivery, out: Outcome) -> None:
        event = Event.from_record(d.record, self.ckpt_dir, d.delivery_id)
        kwargs = {k: v for k, v in event.data.items() if k.isidentifier()}
        result: list[Any] = []
        error: list[BaseException] = []

        def call() -> None:
            try:
                result.append(fn(event, **kwargs))
            except BaseException as exc:
                error.append(exc)

        timeout = d.hook.options.timeout
        if timeout is None:
            call()
        else:  # a thread we can stop waiting for (Python cannot kill it: it runs on, detached)
            t = threading.Thread(target=call, daemon=True, name=f"callback-{d.hook.short_id}")
            t.start()
            t.join(timeout)
            if t.is_alive():
                out.status, out.error = "timeout", f"timed out after {timeout:g}s (left running)"
                return
        if error:
            exc = error[0]
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            log.error(
                "callback %s failed on %s seq %s:\n%s",
                d.hook.label,
                d.hook.event,
                d.record["seq"],
                tb,
            )
            out.status, out.error, out.stderr_tail = (
                "failed",
                f"{type(exc).__name__}: {exc}",
                tb[-TAIL_BYTES:],
            )
            return
        out.status, out.error = "ok", None
        controls = result[0] if isinstance(result[0], (list, tuple)) else [result[0]]
        sent = []
        for c in controls:
            if isinstance(c, Control):
                cid = send_command(self.ckpt_dir, c, source=f"{self.control_source}:{d.hook.label}")
                sent.append(f"{c.command}:{cid}")
        out.control = sent or None

    # -- completion and cursor -----------------------------------------------------------

    def _complete(self, d: _Delivery, out: Outcome) -> None:
        with self._lock:
            self.outcomes.append(out)
            if out.failed:
                self.failed_final += 1
            d.batch.pending -= 1
            self.state.done.setdefault(d.hook.id, set()).add(d.record["seq"])
        if self.results_path is not None:
            self.results_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.results_path, "ab") as f:
                f.write(orjson.dumps(asdict(out), option=orjson.OPT_APPEND_NEWLINE))
        if self.reporter is not None and out.status != "coalesced":
            self.reporter(out)
        self._advance()
        self.waker.wake()

    def _advance(self) -> None:
        """Move the durable cursor past every leading batch whose deliveries are all done."""
        with self._lock:
            while self._batches and self._batches[0].pending <= 0:
                self._batches.popleft()
            if self._batches:
                head = self._batches[0]
                self.state.offset, self.state.line_no = head.offset, head.line_no
                floor = head.min_seq
                self.state.done = {
                    k: {s for s in v if s >= floor} for k, v in self.state.done.items()
                }
            else:
                self.state.offset, self.state.line_no = self.reader.offset, self.reader.line_no
                self.state.done = {}
            snapshot = CursorState(
                self.state.offset,
                self.state.line_no,
                self.state.fingerprint,
                {k: set(v) for k, v in self.state.done.items()},
            )
            try:
                self.cursor.save(snapshot)
            except OSError as exc:
                self._notice(f"cannot save cursor {self.cursor.path}: {exc}")

    def _shutdown(self) -> None:
        self.waker.stop()
        for runner in self._runners.values():
            for d in runner.close():
                self._complete(
                    d,
                    Outcome(
                        d.delivery_id,
                        d.hook.label,
                        d.hook.event,
                        d.record["seq"],
                        d.record.get("step", 0),
                        "abandoned",
                        error="watcher stopped",
                    ),
                )

    def _notice(self, msg: str) -> None:
        if msg not in self.notices:
            self.notices.append(msg)
            log.warning(msg)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=3)
            return
        except subprocess.TimeoutExpired:
            continue
