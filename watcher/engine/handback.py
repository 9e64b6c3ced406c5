"""What Python callbacks hand back: the ``Control``s and ``Report``s they return, sent to
the control channel and the reports inbox with who sent them, and what became of them.

A return value that is neither None nor an action fails its delivery, in one line
(:func:`watcher.hooks.callbacks.returned_actions`). A report is judged by the journal's writer
later (rank 0 at its next step boundary): a refusal comes back as a ``control`` record,
which the engine hands to :meth:`HandBack.note_records`, so the hook's maker hears of it. A
command returned for ``train_end`` can never be applied: it is journaled as rejected at once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from journal.channels.control import (
    CommandRefused,
    Control,
    new_command_id,
    refuse,
    send_command,
)
from journal.channels.reports import InvalidReport, Report, submit_report
from journal.record.record import Record
from journal.rundir.inbox import MAX_NAME_CHARS, clip, refused_report
from watcher.hooks.callbacks import BadReturn, returned_actions
from watcher.hooks.delivery import Delivery, DeliveryResult

#: Reports sent and not yet seen in the journal (journaled or refused), remembered to say
#: a refusal to whoever made the report; the oldest are forgotten beyond this.
REPORTS_AWAITED = 65_536


class HandBack:
    """Sends what one watcher's callables return. ``control_source`` starts the ``source``
    of what they send; ``notice`` says a line once (a refusal, a late command)."""

    def __init__(self, ckpt_dir: str, control_source: str, notice: Callable[[str], None]) -> None:
        self.ckpt_dir = ckpt_dir
        self.control_source = control_source
        self.notice = notice
        #: id of each report sent and not yet seen journaled -> who made it (hook, record)
        self._awaited: OrderedDict[str, str] = OrderedDict()
        self._awaited_lock = threading.Lock()

    def source(self, d: Delivery) -> str:
        """Who sent a command or report: ``watcher:<cursor>:<hook>``, cut to 256 characters
        (a hook's label is its whole command line: 2,000 characters is no rarity)."""
        return clip(f"{self.control_source}:{d.hook.label}", MAX_NAME_CHARS)

    def act_on(self, returned: Any, d: Delivery, out: DeliveryResult) -> None:
        """Send the ``Control``s and ``Report``s a callable returned (alone or in a list).
        Anything else fails the delivery, naming what came back (nothing is sent then)."""
        try:
            items = returned_actions(returned)
        except BadReturn as exc:
            out.status, out.error = "failed", str(exc)
            return
        source = self.source(d)
        for item in items:
            if isinstance(item, Control):
                if d.record["event"] == "train_end":  # nothing will ever apply it
                    cid = self._reject_late(item, d, source)
                    out.control = [*(out.control or []), f"{item.command}:{cid}:rejected"]
                    continue
                try:
                    cid = send_command(self.ckpt_dir, item, source=source)
                except CommandRefused as exc:  # the run reads no more: nothing in control/
                    self.notice(f"control from {source}: {exc}")
                    cid = f"{exc.command_id or 'none'}:rejected"
                out.control = [*(out.control or []), f"{item.command}:{cid}"]
            else:
                try:
                    self.submit(item, d, out)
                except InvalidReport as exc:  # e.g. a checkpoint outside the run
                    out.status, out.error = "failed", f"report: {exc}"

    def _reject_late(self, item: Control, d: Delivery, source: str) -> str:
        """A command returned for ``train_end``: the attempt it would steer has ended, and
        the next one would reject its file as stale. It gets its verdict now: a ``control``
        record, rejected, as the trainer journals one (taken as a reporter takes the journal
        after training), and one line; no file is left in ``control/``. Returns its id."""
        cid = new_command_id()
        why = f"the run had ended (train_end at step {d.record['step']})"
        self.notice(
            f"control {item.command} (id {cid}) from {source} on train_end rejected: {why}; "
            "a command returned at train_end cannot be applied"
        )
        refuse(self.ckpt_dir, item.command, cid, source, why)
        return cid

    def submit(self, report: Report, d: Delivery, out: DeliveryResult) -> None:
        """A report for the delivered event's checkpoint unless it names another one."""
        data = d.record["data"]
        if report.checkpoint_path is None and isinstance(data.get("checkpoint_path"), str):
            report.checkpoint_path = data["checkpoint_path"]
        if report.step is None:
            report.step = d.record["step"]
        who = f"{clip(d.hook.label, 200)} ({d.hook.event} step {d.record['step']})"

        def written(rid: str) -> None:  # before any writer can journal it (note_records)
            with self._awaited_lock:
                self._awaited[rid] = who
                while len(self._awaited) > REPORTS_AWAITED:
                    self._awaited.popitem(last=False)

        rid = submit_report(
            self.ckpt_dir,
            report,
            source=self.source(d),
            delivery_id=d.delivery_id,
            written=written,
        )
        out.reports = [*(out.reports or []), rid]

    def note_records(self, records: list[Record]) -> None:
        """Records just read: a ``report`` of ours is in the journal; a refusal of one is
        said in one line naming its hook and the reason (the delivery said "ok" when it
        handed the report in: the journal's writer judges it later)."""
        if not self._awaited:  # the common case: one attribute read per batch
            return
        for rec in records:
            event = rec["event"]
            if event != "report" and event != "control":
                continue
            data = rec["data"]
            refused = refused_report(data) if event == "control" else None
            rid = refused.stem if refused is not None else data.get("id")
            with self._awaited_lock:
                who = self._awaited.pop(rid, None) if isinstance(rid, str) else None
            if who is not None and refused is not None:
                self.notice(
                    f"report {rid} from {who} was refused by the journal's writer: "
                    f"{refused.why} (its metrics are not in the journal)"
                )
