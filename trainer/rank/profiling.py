"""``--profile-steps A:B``: where the time of a few training steps goes, with torch.profiler.

Every rank records steps A to B (CPU ops, and the CUDA kernels on a GPU) and writes, under
``logs/profile/`` of the run:

- ``rank-R-steps-A-B.json.gz``: the Chrome trace (open it in https://ui.perfetto.dev or
  chrome://tracing): the timeline of host ops and device kernels;
- ``rank-R-steps-A-B.txt``: a headline and the ops that took the most time (self time, on
  the device where there is one).

The headline says how long the steps took and, on a GPU, how much of that time the device
ran kernels: a step whose device is busy well under 100 % is bound by the host (Python,
launch and framework overhead), not by the GPU's arithmetic. The profiler slows the steps it
records, so their ``log`` records are not throughput figures. Writing the trace (seconds on
a busy machine) is a declared phase, and its seconds are in step B's ``step_end``
(``profile_s``): no hang, live or backtested (docs/alerts.md).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from journal.rundir.files import atomic_write
from journal.rundir.phase import PhaseMarker

if TYPE_CHECKING:  # torch is imported where a profile is taken: the launcher parses the
    import torch  # option (trainer.config.fields.parse_profile_steps) without torch
    from torch.profiler import profile

log = logging.getLogger("trainer")

#: Rows of the op table in the ``.txt`` summary.
TOP_OPS = 30


class StepProfiler:
    """Profiles steps ``first`` to ``last`` of this rank (``steps`` None: does nothing).

    ``step_begin(step)``/``step_end(step)`` bracket each optimizer step; ``close()`` writes
    what was recorded when the run ends inside the range (a stop command, an interrupt)."""

    def __init__(
        self,
        steps: tuple[int, int] | None,
        out_dir: Path,
        rank: int,
        device: torch.device,
        phases: PhaseMarker,
    ) -> None:
        self.steps, self.out_dir, self.rank, self.device = steps, out_dir, rank, device
        self.phases = phases
        self._prof: profile | None = None
        self._first_recorded = 0
        self._last_recorded = 0
        self._t0 = 0.0

    def step_begin(self, step: int) -> None:
        if (
            self.steps is None
            or self._prof is not None
            or not self.steps[0] <= step <= self.steps[1]
        ):
            return  # not asked for, recording already, or outside the range (a resume past it)
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, record_shapes=True)
        self._prof.__enter__()
        self._first_recorded = step
        self._t0 = time.perf_counter()

    def step_end(self, step: int) -> float:
        """After the step's work, before its ``step_end``: the seconds :meth:`close` took."""
        if self._prof is not None:
            self._last_recorded = step
            if self.steps is not None and step >= self.steps[1]:
                return self.close()
        return 0.0

    def close(self) -> float:
        """Stop recording and write the trace and the summary, in a declared phase; the
        seconds that took (0: not recording)."""
        prof, self._prof = self._prof, None
        if prof is None:
            return 0.0
        began = time.perf_counter()
        with self.phases("profile"):
            self._write(prof)
        return time.perf_counter() - began

    def _write(self, prof: profile) -> None:
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the recorded kernels have all ended
        wall_s = time.perf_counter() - self._t0
        prof.__exit__(None, None, None)
        first, last = self._first_recorded, self._last_recorded  # step_end ran for each step
        stem = self.out_dir / f"rank-{self.rank}-steps-{first}-{last}"
        trace = stem.with_suffix(".json.gz")
        headline = self._headline(prof, first, last, wall_s)
        sort_by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=sort_by, row_limit=TOP_OPS)
        text = f"{headline}\ntrace: {trace}\n\n{table}\n".encode()
        # first: it makes logs/profile/, never through a symlink (logs/ is none)
        atomic_write(stem.with_suffix(".txt"), text, root=self.out_dir.parent, durable=False)
        prof.export_chrome_trace(str(trace))
        log.info("profile: %s; %s", headline, stem.with_suffix(".txt"))

    def _headline(self, prof: profile, first: int, last: int, wall_s: float) -> str:
        steps = last - first + 1
        head = f"steps {first}-{last}: {wall_s / steps:.3f} s a step (under the profiler)"
        if self.device.type != "cuda":
            return head
        from torch.autograd import DeviceType

        # Kernels of one stream do not overlap: their summed time is the time the device was
        # busy (an upper bound where streams overlap, e.g. NCCL beside compute). Annotated
        # ranges on the device's timeline (FSDP's record_function spans) are not work.
        kernels = (
            e
            for e in prof.events()
            if e.device_type == DeviceType.CUDA and not e.is_user_annotation
        )
        busy_s = sum(e.time_range.elapsed_us() for e in kernels) / 1e6
        return f"{head}; device busy {busy_s / steps:.3f} s a step ({100 * busy_s / wall_s:.0f} %)"
