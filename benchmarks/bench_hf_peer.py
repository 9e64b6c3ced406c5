"""ilab-train against HF ``transformers.Trainer``, what users would otherwise pick.

The same random 4-layer Llama (hidden 256, vocab 512), data (16 samples x 128 tokens per
step), learning-rate schedule and step count, trained on 2 CPU ranks by each: HF Trainer
under torchrun (DDP over gloo), and ``ilab-train`` (FSDP2 over gloo, with ``--sharding full``, the default, and
``--sharding replicate``) with its journal and an ``ilab-watch`` tailing it. Reported: tokens/s of the training loop of each, the ratio, and
the final loss of each (the loss of the last step, and the mean of the last 10).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import bench_parser, emit

BIN = Path(sys.executable).parent
VOCAB, SEQ, BATCH, LR, WARMUP = 512, 128, 16, 1e-3, 10

HF_SCRIPT = r"""
import json, os, sys, time, torch
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
model_dir, data, out, steps, lr, warmup = sys.argv[1:7]
rows = [json.loads(line) for line in open(data)]

class Rows(torch.utils.data.Dataset):
    def __len__(self):
        return len(rows)
    def __getitem__(self, i):
        ids = torch.tensor(rows[i]["input_ids"])
        return {"input_ids": ids, "labels": ids.clone()}

args = TrainingArguments(
    output_dir=out, per_device_train_batch_size=PER_RANK, max_steps=int(steps),
    learning_rate=float(lr), warmup_steps=int(warmup), lr_scheduler_type="cosine",
    weight_decay=0.0, max_grad_norm=1.0, logging_steps=1, save_strategy="no",
    report_to=[], use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0, seed=42,
    data_seed=42, disable_tqdm=True,
)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
callbacks = []
if os.environ.get("WITH_JOURNAL"):  # bench_hf_bridge: the same run, journaled
    from trainer.integrations.hf_trainer import JournalCallback
    callbacks.append(JournalCallback())
trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=callbacks)
result = trainer.train()
if trainer.is_world_process_zero():
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    json.dump({"runtime_s": result.metrics["train_runtime"], "losses": losses},
              open(out + "/result.json", "w"))
torch.distributed.destroy_process_group()  # gloo may abort the interpreter at exit otherwise
sys.stdout.flush()
os._exit(0)
""".replace("PER_RANK", str(BATCH // 2))


def make_inputs(d: Path, steps: int) -> tuple[Path, Path]:
    import torch
    import transformers

    model = d / "llama"
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=SEQ,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(model)
    rng = random.Random(0)
    data = d / "train.jsonl"
    with open(data, "w") as f:
        for _ in range(steps * BATCH):
            # a learnable sequence: a random start, then counting up modulo the vocabulary
            start = rng.randrange(VOCAB)
            f.write(json.dumps({"input_ids": [(start + k) % VOCAB for k in range(SEQ)]}) + "\n")
    return model, data


def run_hf(d: Path, model: Path, data: Path, steps: int, journal: bool = False) -> dict[str, Any]:
    script = d / "hf_train.py"
    script.write_text(HF_SCRIPT)
    out = d / ("hf-journal" if journal else "hf-out")
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"WITH_JOURNAL": "1"} if journal else {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += [str(script), str(model), str(data), str(out), str(steps), str(LR), str(WARMUP)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"HF Trainer failed:\n{proc.stderr[-3000:]}")
    res = json.loads((out / "result.json").read_text())
    return {"runtime_s": res["runtime_s"], "losses": res["losses"], "out": out}


def run_ours(
    d: Path, model: Path, data: Path, steps: int, sharding: str = "full", watch: bool = True
) -> dict[str, Any]:
    from journal.read.reader import read_all
    from journal.rundir.paths import journal_path

    ckpt = d / f"ours-{sharding}-{watch}"
    conf = d / f"ours-{sharding}-{watch}.json"
    # what HF's cosine schedule does: decay to 0 (ours defaults to 10 % of the peak)
    conf.write_text(
        json.dumps({"save_final": False, "save_at_epoch_end": False, "min_lr_ratio": 0.0})
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ckpt.mkdir()
    watcher = subprocess.Popen(
        [str(BIN / "ilab-watch"), str(ckpt), "--on-train-end", "true"] if watch else ["true"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    cmd = [str(BIN / "ilab-train"), "--config", str(conf), "--model-path", str(model)]
    cmd += ["--data", str(data), "--ckpt-dir", str(ckpt), "--nproc-per-node", "2", "--quiet"]
    cmd += ["--batch-size", str(BATCH), "--max-steps", str(steps), "--lr", str(LR)]
    cmd += ["--warmup-steps", str(WARMUP), "--sharding", sharding]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    watcher.wait(timeout=60)
    if proc.returncode != 0:
        raise SystemExit(f"ilab-train failed:\n{proc.stderr[-3000:]}")
    recs = read_all(journal_path(ckpt)).records
    begins = [r["ts"] for r in recs if r["event"] == "step_begin"]
    ends = [r["ts"] for r in recs if r["event"] == "step_end"]
    losses = [r["data"]["loss"] for r in recs if r["event"] == "log"]
    return {"runtime_s": ends[-1] - begins[0], "losses": losses}


def main() -> None:
    args = bench_parser(__doc__).parse_args()
    steps = 20 if args.quick else 60
    out: dict[str, Any] = {"steps": steps, "tokens_per_step": BATCH * SEQ}
    with tempfile.TemporaryDirectory(prefix="bench-hf-peer-") as tmp:
        d = Path(tmp)
        model, data = make_inputs(d, steps)
        t = time.perf_counter()
        hf = run_hf(d, model, data, steps)
        out["hf_wall_s"] = time.perf_counter() - t
        runs = {"hf": hf}
        for sharding in ("full", "replicate"):
            t = time.perf_counter()
            runs[f"ours_{sharding}"] = run_ours(d, model, data, steps, sharding)
            out[f"ours_{sharding}_wall_s"] = time.perf_counter() - t
    tokens = steps * BATCH * SEQ
    for name, r in runs.items():
        out[f"{name}_train_loop_s"] = r["runtime_s"]
        out[f"{name}_tokens_per_s"] = tokens / r["runtime_s"]
        out[f"{name}_final_loss"] = r["losses"][-1]
        out[f"{name}_last10_mean_loss"] = sum(r["losses"][-10:]) / len(r["losses"][-10:])
    for sharding in ("full", "replicate"):
        out[f"ours_{sharding}_vs_hf_throughput"] = (
            out[f"ours_{sharding}_tokens_per_s"] / out["hf_tokens_per_s"]
        )
    emit("bench_hf_peer", out, args.json)


if __name__ == "__main__":
    main()
