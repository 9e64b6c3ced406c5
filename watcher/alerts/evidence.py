"""What a hang alert carries: every local rank's Python stack (``py-spy dump``), the
launcher's view of the run's processes, and on CUDA with NCCL torch's flight recorder.

Files go under ``<run>/alerts/<alert-id>/`` (:func:`watcher.alerts.alert.evidence_dir`),
written before the alert is raised; their paths are relative to the run dir. What cannot
be captured (py-spy missing, ptrace refused, a rank on another host, a flight recorder that
did not answer) is one line each in the alert's ``missing``: the alert goes out anyway.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from journal.rundir.files import atomic_write
from journal.rundir.paths import logs_dir
from journal.rundir.safety import FIFO, UnsafeRunDir, open_no_follow
from watcher.alerts.processes import GONE, STATES, Proc, ProcessView

#: Seconds one ``py-spy dump`` may take (it pauses the process meanwhile).
PYSPY_TIMEOUT_S = 20.0
#: Seconds the ranks' NCCL watchdogs get to write the flight recorder once asked.
FLIGHT_RECORDER_WAIT_S = 10.0
#: The flight recorder's dumps and trigger pipes, in the run's logs (the launcher points
#: torch's ``TORCH_NCCL_DEBUG_INFO_*`` at them: :func:`flight_recorder_env`); a hang alert
#: moves the dumps it asked for into its evidence.
FLIGHT_RECORDER_DIR = "flight-recorder"
TRACE_BUFFER_ENTRIES = "2000"


def py_spy() -> str | None:
    """The ``py-spy`` executable: beside this Python (a venv), else on ``PATH``."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy")


def flight_recorder_env(run_dir: Path, env: dict[str, str]) -> dict[str, str]:
    """The variables that make each rank's NCCL process group keep a flight recorder
    (``TORCH_NCCL_TRACE_BUFFER_SIZE``) and dump it when its pipe is written
    (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``) into ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``: what a
    hang alert collects. A value the user set stays; without NCCL they do nothing. The
    directory is made by a rank that starts NCCL (a gloo run leaves no trace of it)."""
    where = logs_dir(run_dir) / FLIGHT_RECORDER_DIR
    out = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": TRACE_BUFFER_ENTRIES,
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(where / "trace_rank_"),
        "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": str(where / "pipe_rank_"),
    }
    return {k: env.get(k, v) for k, v in out.items()}


@dataclass
class Evidence:
    """What was captured (paths relative to the run dir) and what could not be."""

    files: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    stacks: dict[int, str] = field(default_factory=dict)  # rank -> its py-spy dump


def _py_spy_error(text: str) -> str:
    """py-spy's error in one line: ``Error: ...`` and its causes, without the backtrace."""
    head, causes, in_causes = "", [], False
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Error:") and not head:
            head = line.removeprefix("Error:").strip()
        elif line.startswith("Caused by"):
            in_causes = True
        elif line.startswith("Stack backtrace"):
            break
        elif in_causes and line:
            causes.append(line.split(":", 1)[-1].strip())
    return "; ".join(x for x in (head, *causes) if x) or text.strip()[:200]


def _run_py_spy(argv: list[str]) -> tuple[str | None, str]:
    """``(stdout, "")`` when py-spy dumped a stack, else ``(None, why not)``."""
    try:  # py-spy writes UTF-8, whatever this process's locale says
        done = subprocess.run(
            argv, capture_output=True, timeout=PYSPY_TIMEOUT_S, encoding="utf-8", errors="replace"
        )
    except subprocess.TimeoutExpired:
        return None, f"py-spy did not answer within {PYSPY_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return None, f"py-spy could not run: {exc}"
    if done.returncode == 0 and "Thread " in done.stdout:
        return done.stdout, ""
    return None, _py_spy_error(done.stderr or done.stdout)


def _dump_stack(exe: str, proc: Proc, out: Path) -> str | None:
    """``py-spy dump`` of one rank into ``out``; None when written, else why not. A stopped
    process is read without pausing it (``--nonblocking``: ptrace cannot stop it again),
    and so is one that could not be paused (stopped meanwhile)."""
    argv = [exe, "dump", "--pid", str(proc.pid)]
    stack, why = _run_py_spy(argv + (["--nonblocking"] if proc.stopped else []))
    if stack is None and not proc.stopped and "ermission" not in why:
        stack, why = _run_py_spy([*argv, "--nonblocking"])
    if stack is None:
        if "ermission" in why or "not permitted" in why:
            return (
                f"ptrace refused ({why}): run the watcher as the trainer's user where ptrace "
                "is allowed (kernel.yama.ptrace_scope, CAP_SYS_PTRACE)"
            )
        return f"py-spy failed: {why}"
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    text = f"# py-spy dump --pid {proc.pid} ({proc.role}, {stamp})\n{stack}"
    atomic_write(out, text.encode(), root=out.parent, durable=False)  # collect checked it
    return None


def stacks(run_dir: Path, where: Path, view: ProcessView, ev: Evidence) -> None:
    """One ``rank-<N>.txt`` per rank on this host; the others said in ``missing``."""
    ranks = view.ranks()
    local = [p for p in ranks if p.local and p.alive]
    remote = [p for p in ranks if not p.local]
    if remote:
        hosts = sorted({p.host or "?" for p in remote})
        names = ", ".join(str(p.rank) for p in remote)
        ev.missing.append(
            f"stacks of rank(s) {names} not captured: they run on {', '.join(hosts)}, not "
            f"on this host (run ilab-watch --hang-after there too)"
        )
    for p in ranks:
        if p.local and not p.alive:
            ev.missing.append(f"stack of rank {p.rank} (pid {p.pid}) not captured: it is gone")
    if not local:
        return
    exe = py_spy()
    if exe is None:
        ev.missing.append("stacks not captured: py-spy is not installed (pip install py-spy)")
        return
    with ThreadPoolExecutor(max_workers=min(8, len(local))) as pool:
        outs = {p.pid: where / f"rank-{p.rank}.txt" for p in local}
        results = list(pool.map(lambda p: (p, _dump_stack(exe, p, outs[p.pid])), local))
    for p, why in results:
        if why is None and p.rank is not None:
            ev.files.append(str(outs[p.pid].relative_to(run_dir)))
            ev.stacks[p.rank] = outs[p.pid].read_text(encoding="utf-8", errors="replace")
        else:
            ev.missing.append(f"stack of rank {p.rank} (pid {p.pid}) not captured: {why}")


def flight_recorder(run_dir: Path, where: Path, view: ProcessView, ev: Evidence) -> None:
    """Ask each local rank's NCCL watchdog for its flight recorder (write to its pipe) and
    move the dumps into ``where``. Only where the attempt runs NCCL."""
    base = logs_dir(run_dir) / FLIGHT_RECORDER_DIR
    asked: dict[int, Path] = {}
    for p in view.ranks():
        if not p.local or p.rank is None:
            continue
        pipe = base / f"pipe_rank_{p.rank}.pipe"
        dump = base / f"trace_rank_{p.rank}"
        try:  # a pipe nobody reads (ENXIO) is said, never waited on; never through a link
            fd = open_no_follow(pipe, os.O_WRONLY, root=run_dir, kinds=FIFO)
        except UnsafeRunDir as exc:
            ev.missing.append(f"flight recorder of rank {p.rank} not captured: {exc}")
            continue
        except OSError as exc:
            ev.missing.append(
                f"flight recorder of rank {p.rank} not captured: its pipe {pipe.name} cannot "
                f"be written ({exc.strerror}; TORCH_NCCL_TRACE_BUFFER_SIZE unset, or the "
                "rank was not launched by ilab-train)"
            )
            continue
        with contextlib.suppress(OSError):
            dump.unlink()  # a dump of an earlier hang is not this one's
        try:
            os.write(fd, b"1\n")
        finally:
            os.close(fd)
        asked[p.rank] = dump
    deadline = time.monotonic() + FLIGHT_RECORDER_WAIT_S
    while asked and time.monotonic() < deadline:
        for rank, dump in list(asked.items()):
            if dump.exists() and dump.stat().st_size > 0:
                time.sleep(0.2)  # written whole by the watchdog, then left alone
                target = where / f"flight-recorder-rank-{rank}.pkl"
                os.replace(dump, target)  # both in the run dir: a rename
                ev.files.append(str(target.relative_to(run_dir)))
                del asked[rank]
        time.sleep(0.1)
    for rank in asked:
        ev.missing.append(
            f"flight recorder of rank {rank} not captured: no dump within "
            f"{FLIGHT_RECORDER_WAIT_S:.0f}s of asking (its NCCL watchdog may be stuck too)"
        )


def collect(
    run_dir: Path,
    where: Path,
    view: ProcessView,
    *,
    summary: str,
    nccl: bool,
) -> Evidence:
    """Everything a hang alert carries, into ``where`` (created). ``summary``: the
    finding, first line of ``processes.txt``; ``nccl``: the attempt runs NCCL on CUDA."""
    ev = Evidence()
    view.update()
    procs = where / "processes.txt"
    text = f"# {summary}\n# the launcher's view of the run's processes\n{view.describe()}"
    try:  # alerts/ (or logs/ below) a symlink: said in the alert, nothing written there
        atomic_write(procs, text.encode(), root=run_dir, durable=False)
    except UnsafeRunDir as exc:
        ev.missing.append(f"no evidence captured: {exc}")
        return ev
    ev.files.append(str(procs.relative_to(run_dir)))
    stacks(run_dir, where, view, ev)
    if nccl:
        flight_recorder(run_dir, where, view, ev)
    return ev


def stuck(view: ProcessView, stacks: dict[int, str]) -> str:
    """The local ranks a hang is about, in words, and why: stopped, in uninterruptible
    wait, zombie or gone (``/proc``), or, by their stacks (``stacks``: rank -> py-spy
    dump), with a main thread outside any torch.distributed call. A rank whose main thread
    is in one waits in a collective for those: it is named as waiting, not stuck."""
    odd, waiting = [], []
    for p in view.ranks():
        frame = re.search(r'"MainThread"\n\s+(\S.*)', stacks.get(p.rank or 0, ""))
        state = f"rank {p.rank} (pid {p.pid}) {STATES.get(p.state or '', p.state)}"
        if p.local and p.state in ("T", "t", "D", "Z", "X", GONE):
            odd.append(state)
        elif frame and "(torch/distributed/" in frame[1]:
            waiting.append(f"rank {p.rank} waits in {frame[1].split(' (')[0]}")
        elif frame:
            odd.append(f"{state} outside any collective, in {frame[1]}")
    waits = f" ({', '.join(waiting)})" if waiting else ""
    if odd:
        return f"stuck: {'; '.join(odd)}{waits}"
    return f"no rank here is stopped, gone or outside a collective{waits}: see the stacks"
