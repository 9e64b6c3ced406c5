#!/usr/bin/env python3
"""Exact-match arithmetic eval of a chat model: greedy generation through its chat template.

Run by ``ilab-watch --on-save examples/eval_llm.py`` on every checkpoint of ``make
demo-llm`` (or by hand with ``--model DIR`` for the base model). Loads the consolidated
export (``<checkpoint>/hf``, with its tokenizer and chat template) with
``AutoModelForCausalLM.from_pretrained``, asks each held-out problem of
``<run>/llm_data/heldout.jsonl`` and counts a reply as correct when the last integer in it is
the answer. Prints the accuracy and reports it (``$ILAB_REPORT`` when run by a watcher).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

INTEGER = re.compile(r"-?\d+")


def answer_of(reply: str) -> str | None:
    """The last integer in a reply ("17 + 25 = 42." -> "42"), or None."""
    found = INTEGER.findall(reply.replace(",", ""))
    return found[-1] if found else None


def evaluate(model_dir: Path, problems: list[dict[str, str]]) -> tuple[float, list[str]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    replies = []
    with torch.no_grad():
        for p in problems:
            enc = tok.apply_chat_template(
                [{"role": "user", "content": p["question"]}],
                add_generation_prompt=True,
                return_tensors="pt",
                return_dict=True,
            )
            out = model.generate(**enc, max_new_tokens=12, do_sample=False)
            reply = tok.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            replies.append(reply.strip())
    correct = sum(answer_of(r) == p["answer"] for r, p in zip(replies, problems, strict=True))
    return correct / len(problems), replies


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", type=Path, default=None, help="model dir (default: the checkpoint's hf/)"
    )
    ap.add_argument("--run-dir", type=Path, default=os.environ.get("ILAB_CKPT_DIR"))
    ap.add_argument("--limit", type=int, default=40)
    args = ap.parse_args()
    ckpt = os.environ.get("ILAB_CHECKPOINT_PATH")
    model_dir = args.model or (Path(ckpt) / "hf" if ckpt else None)
    if model_dir is None or args.run_dir is None:
        ap.error("give --model and --run-dir, or run me from ilab-watch --on-save")
    heldout = Path(args.run_dir) / "llm_data" / "heldout.jsonl"
    problems = [json.loads(line) for line in heldout.read_text().splitlines()][: args.limit]
    t0 = time.perf_counter()
    acc, replies = evaluate(model_dir, problems)
    step = int(os.environ.get("ILAB_STEP", "0") or 0)
    print(
        f"eval: step {step}: accuracy {acc:.3f} on {len(problems)} held-out problems "
        f"in {time.perf_counter() - t0:.0f}s; e.g. {problems[0]['question']!r} -> {replies[0]!r}",
        flush=True,
    )
    if os.environ.get("ILAB_REPORT"):  # run by ilab-watch: it journals the report
        Path(os.environ["ILAB_REPORT"]).write_text(
            json.dumps({"accuracy": acc, "eval_problems": len(problems)})
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
