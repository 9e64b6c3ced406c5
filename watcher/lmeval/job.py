"""The command ``ilab-watch --lm-eval`` runs for each save (locally, or as a ``--via`` job):
lm-eval on the save's Hugging Face export, its metrics written to ``$ILAB_REPORT``.

``python -m watcher.lmeval.job --tasks T [--limit N] [--include-path DIR] [--args '...']``
reads the export's path from ``$ILAB_HF_PATH`` (the save record's ``hf_path``), runs
``python -m lm_eval run --model hf --model_args '{"pretrained": "<hf_path>"}' --tasks T
--output_path <temp dir> ...`` with the same Python, and turns the results file lm-eval
wrote into report metrics (watcher/lmeval/metrics.py). lm-eval's own output goes to the
job's log; a failure ends with one line saying why (exit 1); a save without an export, or
whose ``hf_path`` is refused (:func:`checked_hf_path`), with one line (exit 2).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

from journal.rundir.files import atomic_write
from watcher.lmeval.metrics import metrics_from_results

#: lm-eval's error lines end its stderr; these words start the one that says why.
_ERROR_WORDS = ("Error", "Exception", "error:", "KeyError", "OSError", "ValueError")


class Refused(ValueError):
    """A save's ``hf_path`` lm-eval is not given (the message is the one line to say)."""


def checked_hf_path(hf_path: str, ckpt_dir: str | None) -> str:
    """``hf_path`` (the save record's, as written by whoever can append to the journal)
    resolved, once it is known to be only a model dir of this run: raises
    :class:`Refused` when it holds a ``,`` or ``=`` (lm-eval would read the rest as more
    model arguments: ``...,trust_remote_code=True``) or does not lie under the run's
    checkpoint dir ``ckpt_dir`` (``$ILAB_CKPT_DIR``; symlinks and ``..`` resolved)."""
    said = f"lm-eval: refusing the save's hf_path {hf_path!r}"
    if "," in hf_path or "=" in hf_path:
        raise Refused(f"{said}: a ',' or '=' in it would be read as more lm-eval model arguments")
    if not ckpt_dir:
        raise Refused(f"{said}: $ILAB_CKPT_DIR is not set (the job runs as ilab-watch's hook)")
    root, path = os.path.realpath(ckpt_dir), os.path.realpath(hf_path)
    if os.path.commonpath([root, path]) != root:
        raise Refused(f"{said}: it is not under the run's checkpoint dir {ckpt_dir!r}")
    # an absolute path: a dir that is missing is never looked up on the Hugging Face Hub
    return path


def lm_eval_argv(
    hf_path: str, tasks: str, limit: float | None, include_path: str | None, extra: str
) -> list[str]:
    """lm-eval's command line for one export; ``extra`` (``--lm-eval-args``) is split like
    a shell would and comes last, so its ``--model_args`` are merged into ours by lm-eval.
    The export is given as JSON: lm-eval takes a JSON object whole, never split at a comma."""
    args = shlex.split(extra)
    argv = [sys.executable, "-m", "lm_eval", "run"]
    if "--model" not in args and not any(a.startswith("--model=") for a in args):
        argv += ["--model", "hf"]
    argv += ["--model_args", json.dumps({"pretrained": hf_path}), "--tasks", tasks]
    if limit is not None:
        argv += ["--limit", f"{limit:g}"]
    if include_path:
        argv += ["--include_path", include_path]
    return argv + args


def why(stderr: str, code: int) -> str:
    """The one line that says why lm-eval failed: its last error line."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for line in reversed(lines):
        if any(w in line for w in _ERROR_WORDS):
            return line[-400:]
    return lines[-1][-400:] if lines else f"exit code {code}"


def run(tasks: str, limit: float | None, include_path: str | None, extra: str) -> int:
    """One save's evaluation; the exit code."""
    hf_path = os.environ.get("ILAB_HF_PATH", "")
    step = os.environ.get("ILAB_STEP", "?")
    if not hf_path:
        print(
            f"lm-eval: the save at step {step} has no Hugging Face export (hf_path is null: "
            "train with --save-hf, and an --export-every that includes this save)",
            file=sys.stderr,
        )
        return 2
    try:
        model = checked_hf_path(hf_path, os.environ.get("ILAB_CKPT_DIR"))
    except Refused as exc:
        print(exc, file=sys.stderr)
        return 2
    report = os.environ.get("ILAB_REPORT")
    with tempfile.TemporaryDirectory(prefix="ilab-lm-eval-") as out_dir:
        argv = lm_eval_argv(model, tasks, limit, include_path, extra)
        argv += ["--output_path", out_dir]
        print("lm-eval:", shlex.join(argv), file=sys.stderr, flush=True)
        tail: deque[str] = deque(maxlen=200)
        with subprocess.Popen(argv, stdout=sys.stdout, stderr=subprocess.PIPE, text=True) as proc:
            assert proc.stderr is not None
            for line in proc.stderr:  # lm-eval's whole output goes on to the job's log, live
                sys.stderr.write(line)
                tail.append(line)
        files = sorted(Path(out_dir).rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
        if proc.returncode != 0 or not files:
            said = why("".join(tail), proc.returncode)
            print(f"lm-eval failed on {hf_path}: {said}", file=sys.stderr)
            return 1
        metrics = metrics_from_results(json.loads(files[-1].read_text()))
    if not metrics:
        print(f"lm-eval on {hf_path}: no numeric metric in its results", file=sys.stderr)
        return 1
    print(json.dumps(metrics, sort_keys=True))
    if report:
        atomic_write(report, json.dumps(metrics).encode(), root=Path(report).parent)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m watcher.lmeval.job", description=__doc__)
    parser.add_argument("--tasks", required=True)
    parser.add_argument("--limit", type=float, default=None)
    parser.add_argument("--include-path", default=None)
    parser.add_argument("--args", default="")
    ns = parser.parse_args(argv)
    return run(ns.tasks, ns.limit, ns.include_path, ns.args)


if __name__ == "__main__":
    sys.exit(main())
