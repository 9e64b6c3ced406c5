"""The watcher ``run_training`` embeds: in-process Python callbacks, no code serialization.

It is the same engine as ``ilab-watch``, running on a thread of the launching process. It
delivers only the records of this launch (from the journal's size at launch time) and keeps
its cursor in memory; results still go to ``<ckpt_dir>/watch/embedded.results.jsonl``.
It also runs the experiment-tracker exporters of ``TrainingArgs.report_to``
(:class:`Trackers`), so a user gets them without a second process.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from journal.rundir.paths import journal_path
from watcher.assembly import WatchPlan, assemble
from watcher.exporters.base import close_all
from watcher.exporters.registry import make_exporter, replay_command
from watcher.hooks.callbacks import CallbackSpecError, callable_name
from watcher.hooks.delivery import DeliveryResult, already_said
from watcher.hooks.hook import Hook, HookOptions, assemble_hooks

log = logging.getLogger("watcher")


def _log_result(out: DeliveryResult) -> None:
    if out.status == "abandoned" or already_said(out.error):
        return  # one line for all of them: finish()'s, or the tracker's own notice
    what = f"{out.status}: {out.error}" if out.failed else f"ok in {out.duration or 0:.3f}s"
    level = logging.ERROR if out.failed else logging.INFO
    log.log(level, "callback %s on %s (step %s) %s", out.hook, out.event, out.step, what)


class Trackers:
    """``report_to``'s exporters, run beside training, and what became of each.

    One that cannot start (its package is missing, the tracking server does not answer) is
    one warning line naming the ``ilab-watch`` line that replays the run into it later:
    training goes on. :meth:`outcomes` says the same for one that failed during the run.
    """

    def __init__(
        self, ckpt_dir: Path, names: list[str], settings: dict[str, str] | None = None
    ) -> None:
        self.ckpt_dir, self.settings = ckpt_dir, settings or {}
        self.exporters: dict[str, Any] = {}
        self.errors: dict[str, str] = {}
        for name in names:
            try:
                self.exporters[name] = make_exporter(name, ckpt_dir, settings=self.settings)
            except CallbackSpecError as exc:
                self.errors[name] = str(exc)
                print(
                    f"ilab-train: warning: --report-to {name}: {exc}; training goes on "
                    f"without it (afterwards: {self.replay(name)})",
                    file=sys.stderr,
                )

    def replay(self, name: str) -> str:
        return replay_command(name, self.ckpt_dir, self.settings)

    def outcomes(self, rows: list[dict[str, Any]]) -> dict[str, str]:
        """``{tracker: "ok" | what failed, and how to replay}`` from :func:`summarize`'s rows."""
        out = {n: f"not started: {e}; replay: {self.replay(n)}" for n, e in self.errors.items()}
        for name, exporter in self.exporters.items():
            label = callable_name(type(exporter)) + "."
            errors = [e for r in rows if r["callback"].startswith(label) for e in r["errors"]]
            failed = sum(r["failed"] for r in rows if r["callback"].startswith(label))
            out[name] = "ok"
            if failed:
                out[name] = (
                    f"incomplete: {failed} record(s) not written ({errors[0] if errors else ''}); "
                    f"replay: {self.replay(name)}"
                )
        return out


class EmbeddedWatcher:
    """Delivers one launch's records to in-process callbacks, on a thread of the launcher.

    Args:
        ckpt_dir: the run's checkpoint directory.
        hooks: ``{event: [callable or command string, ...]}`` (the flat ``on_<event>`` API).
        callbacks: callback objects with ``on_<event>`` methods.
        start_offset: the journal's size at launch: earlier records are not delivered (but
            are given to ``restore_state``).
        exporters: experiment-tracker exporters (:class:`Trackers`): every record
            goes to them, not only the newest pending one; closed when the watcher is done.
        node_rank: this launcher's node: its cursor in ``<ckpt_dir>/watch`` (results file,
            running markers, lock) is ``embedded`` on node 0, ``embedded-node<N>`` elsewhere.

    Raises:
        watcher.engine.cursor.CursorBusy: an ``ilab-watch --name embedded`` on this run dir holds
            the cursor (``run_training`` refuses the launch: ``ilab-train`` exits 3).
    """

    def __init__(
        self,
        ckpt_dir: Path,
        *,
        hooks: dict[str, list[Any]],
        callbacks: list[Any],
        start_offset: int,
        exporters: list[Any] | None = None,
        node_rank: int = 0,
    ) -> None:
        built = assemble_hooks(
            [(event, spec) for event, specs in hooks.items() for spec in specs],
            callbacks,
            exporters or [],
            lambda ev: HookOptions(),
        )
        self.exporters = built.exporters
        # its results and running markers are under watch/embedded.*: one process only
        self.watcher = assemble(
            WatchPlan(
                journal_path(ckpt_dir),
                built,
                # each node's launcher runs one: the other nodes' must not be refused
                name="embedded" if node_rank == 0 else f"embedded-node{node_rank}",
                start=start_offset,
                persist_cursor=False,
                reporter=_log_result,
                control_source="run_training",
            )
        )
        self._thread = threading.Thread(target=self._run, name="ilab-embedded-watcher", daemon=True)
        self.exit_code: int | None = None

    def _run(self) -> None:
        try:
            self.exit_code = self.watcher.run()
        except Exception:
            log.exception("embedded watcher failed")
            self.exit_code = 1

    def start(self) -> None:
        self._thread.start()

    def finish(self, grace_s: float) -> list[dict[str, Any]]:
        """The workers are gone: deliver what is left within ``grace_s``, then summarize."""
        self.watcher.writer_finished()
        self._thread.join(grace_s)
        if self._thread.is_alive():
            self.watcher.request_stop()
            self._thread.join(10)
            n = self.watcher.count("abandoned")
            log.warning(
                "callbacks still running after %.0fs grace; abandoned %d deliveries", grace_s, n
            )
        close_all(self.exporters)
        done = self.watcher.completions
        return summarize(self.watcher.hooks, done.tally, done.errors)


def summarize(
    hooks: list[Hook],
    tally: Counter[tuple[str, str, str]],
    errors: dict[tuple[str, str], list[str]],
) -> list[dict[str, Any]]:
    """Per callback: counts by status and the first errors."""
    rows = []
    for h in hooks:
        counts = Counter(
            {st: n for (label, ev, st), n in tally.items() if (label, ev) == (h.label, h.event)}
        )
        rows.append(
            {
                "callback": h.label,
                "event": h.event,
                "deliveries": sum(counts.values()),
                "ok": counts.get("ok", 0),
                "failed": counts.get("failed", 0) + counts.get("abandoned", 0),
                "timeout": counts.get("timeout", 0),
                "skipped": counts.get("skipped", 0),
                "coalesced": counts.get("coalesced", 0),
                "errors": errors.get((h.label, h.event), []),
            }
        )
    return rows
