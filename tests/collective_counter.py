"""A torchrun entry point for tests: the real worker, with torch.distributed calls counted.

Usage: torchrun ... -m tests.collective_counter CONFIG.json
Writes <ckpt_dir>/logs/collectives-rank<r>.json with {op: calls} before the worker exits.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import torch.distributed as dist

import trainer.rank.worker as worker
from journal.rundir.paths import logs_dir

OPS = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "reduce_scatter_single",
    "all_gather_single",
    "barrier",
    "all_to_all",
    "all_to_all_single",
    "reduce",
    "gather",
    "scatter",
    "broadcast_object_list",
    "all_gather_object",
    "send",
    "recv",
)
COUNTS: Counter[str] = Counter()


def _wrap(name: str) -> None:
    orig = getattr(dist, name)

    def counted(*args: object, **kwargs: object) -> object:
        COUNTS[name] += 1
        return orig(*args, **kwargs)

    setattr(dist, name, counted)


for _op in OPS:
    if hasattr(dist, _op):
        _wrap(_op)

_run = worker.run_worker


def run_and_count(cfg: worker.WorkerConfig) -> int:
    code = _run(cfg)
    out = logs_dir(cfg.args.ckpt_dir) / f"collectives-rank{os.environ.get('RANK', '0')}.json"
    out.write_text(json.dumps(dict(COUNTS)))
    return code


worker.run_worker = run_and_count

if __name__ == "__main__":
    worker.main()
