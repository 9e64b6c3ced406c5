"""lm-eval's results as report metrics: ``results[task]["acc,none"]`` becomes
``<task>/acc``.

lm-eval keys each value ``<metric>,<filter>``; the filter ``none`` (no filter, the usual
case for loglikelihood and multiple-choice tasks) is left out of the name, any other is
kept after a dot (``gsm8k/exact_match.strict-match``). Standard errors are kept as
``<task>/<metric>_stderr`` (lm-eval's own name for them), except its ``"N/A"``; ``alias``,
sample counts and other non-numbers are not metrics. Groups (``mmlu``) are reported as
their tasks are. A report's metric names take letters, digits and ``_ . - /``: any other
character becomes ``_``. Imports nothing of lm-eval's: it reads the JSON lm-eval wrote.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_.\-]")


def _part(text: str) -> str:
    return _NOT_IN_NAME.sub("_", text.strip()) or "_"


def metric_name(task: str, key: str) -> str:
    """The report metric for lm-eval's ``key`` (``acc,none``) of ``task``."""
    metric, _, filt = key.partition(",")
    name = f"{_part(task)}/{_part(metric)}"
    return name if filt in ("", "none") else f"{name}.{_part(filt)}"


def metrics_from_results(results: Mapping[str, Any]) -> dict[str, float]:
    """Every numeric metric of lm-eval's results JSON (the whole file, or its ``results``
    mapping), named as the module docstring says."""
    per_task = results.get("results", results)
    out: dict[str, float] = {}
    if not isinstance(per_task, Mapping):
        return out
    for task, values in per_task.items():
        if not isinstance(values, Mapping):
            continue
        for key, value in values.items():
            if "," not in key or isinstance(value, bool) or not isinstance(value, int | float):
                continue  # alias, sample counts, "N/A" standard errors
            if math.isfinite(value):
                out[metric_name(str(task), str(key))] = float(value)
    return out
