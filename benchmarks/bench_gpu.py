"""GPU throughput on one GPU: ilab-train against Hugging Face ``transformers.Trainer``.

What is compared
  One model, the TinyLlama-1.1B architecture (22 layers, hidden 2048, 32 query / 4 KV
  heads, MLP 5632, vocab 32000, untied embeddings; random init, saved in bf16), trained for
  the same steps on the same generated data by each trainer: AdamW, lr 2e-5, bf16 mixed
  precision with fp32 master weights on both sides (HF: the model loaded with
  ``dtype=torch.float32`` and ``bf16=True``, i.e. bf16 autocast; ilab-train: fp32 weights,
  grads and optimizer state, bf16 compute through FSDP2's mixed-precision policy), no
  gradient checkpointing, one GPU, no checkpoint saving. HF rows use
  ``optim="adamw_torch_fused"`` (HF's fast AdamW and its default on torch >= 2.8; see
  ``--hf-optim``) and ``attn_implementation="sdpa"`` (``--hf-attn``).

  fixed length     8 rows x 2048 random tokens per optimizer step (no padding)
    hf, hf+compile (torch_compile=True), hf+liger (use_liger_kernel=True),
    ilab (--packing off --fused-loss off --compile off: today's path), ilab+packing,
    ilab+fused (--fused-loss auto), ilab+compile, ilab+all (--packing on --fused-loss auto
    --compile on), ilab-default (none of those flags: what the defaults pick on CUDA)
  variable length  16 rows per step, lengths log-normal (median 542, mean ~663) clipped to
                   [32, 2048]; tokens/s counts real (non-padding) tokens only
    hf-var (pad to the longest row, 8 per device x 2 accumulation steps),
    hf-var+flat (DataCollatorWithFlattening: padding-free, position_ids; 16 per device),
    hf-var+flat+liger, ilab-var (packing/fused/compile off), ilab-var+packing,
    ilab-var+all, ilab-var-default, and ilab-var+all-32k: --max-batch-len 32768 with 48 rows
    a step (~32k real tokens, so a packed micro-batch really holds ~32k tokens; the "32k
    tokens in one micro-batch fit" check; left out of the best-variable-row comparisons)

How it is measured
  Every configuration runs in its own subprocess (a fresh CUDA context, its own peak memory)
  under a time limit (``--timeout``); a failure (e.g. CUDA out of memory) becomes a row with
  a one-line reason and the bench goes on. The first ``--warmup`` steps (``--compile-warmup``
  for configurations that may compile) are excluded; ``--steps`` steps are timed.
  - tokens/s (the table): real tokens of the timed steps / their summed step time.
    ilab-train: ``batch_metrics.total_length`` and ``elapsed_time`` of its journal's ``log``
    records (step begin to the step's metrics all-reduce). HF: a TrainerCallback timing
    on_step_begin -> on_step_end with ``torch.cuda.synchronize()`` (forward, backward,
    clipping, optimizer step; the batch prefetch and HF's logging fall outside), tokens
    counted by wrapping the collator (non-padding tokens of each collated micro-batch).
  - tokens/s wall (JSON): the same tokens / step-end to step-end wall time (everything,
    both sides: data, logging, journaling).
  - MFU = tokens/s x 6 x N_params / peak, the peak being a bf16 8192^3 matmul measured at
    the start of the run (mean of 10 after 3 warmups), not the datasheet; attention FLOPs
    are not counted.
  - peak GPU memory: HF ``torch.cuda.max_memory_allocated()`` over the timed steps;
    ilab-train the largest ``cuda_max_mem_allocated`` of the timed steps' log records (when
    the journal lacks it: the largest end-of-step ``cuda_mem_allocated``, which the JSON's
    ``peak_mem_source`` says).
  - padding: HF from the collated batches; ilab-train from the journal when it says, else
    by replaying its StepPlanner when packing is off.

Output: a table (each row printed when measured), the acceptance targets (fixed >= 1.2x
hf+liger and >= 55 % MFU; variable real tokens/s >= 0.9x fixed and >= 2x the best HF
variable-length row; the 32k micro-batch fits), and benchmarks/results/bench_gpu.json,
rewritten after every row so a timeout leaves what was measured. ``--merge`` keeps the
rows of an earlier run for configurations not run now (split a run across calls).

Without a CUDA GPU it prints one line and exits 0 (the JSON says ``skipped``).
``--cpu-smoke`` proves the harness on CPU instead: a tiny Llama, fp32, a few steps.

Usage (all 17 configurations take longer than one 10-minute call: split them, --merge)
  python benchmarks/bench_gpu.py --only '^(?!.*var)'       # the 9 fixed-length rows
  python benchmarks/bench_gpu.py --only var --merge        # + the 8 variable-length rows
  python benchmarks/bench_gpu.py --only '^(hf|ilab)$' --steps 5 --quick   # a quick look
  python benchmarks/bench_gpu.py --cpu-smoke               # the harness, on CPU
  python benchmarks/bench_gpu.py --only default --profile 2   # + where the step time goes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import RESULTS, bench_parser, emit, machine

REPO = Path(__file__).resolve().parents[1]
NAME = "bench_gpu"
LR = 2e-5
SEED = 42
SEQ = 2048
FIXED_BATCH, VAR_BATCH, BATCH_32K = 8, 16, 48
MAX_BATCH_LEN = 16384
VAR_MEDIAN, VAR_MEAN, VAR_MIN = 542, 663, 32
VAR_MU = math.log(VAR_MEDIAN)  # median of a log-normal = exp(mu)
VAR_SIGMA = math.sqrt(2 * math.log(VAR_MEAN / VAR_MEDIAN))  # mean = exp(mu + sigma^2 / 2)
GIB = 2**30
ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt)\b|^Error:|^ilab-train:")
OOM = re.compile(r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory")

TINYLLAMA: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}
TINY: dict[str, Any] = {
    **TINYLLAMA,
    "vocab_size": 512,
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
}


def ilab_flags(packing: str, fused: str, compile_: str) -> tuple[str, ...]:
    return ("--packing", packing, "--fused-loss", fused, "--compile", compile_)


@dataclass(frozen=True)
class Config:
    """One row of the table."""

    name: str
    group: Literal["fixed", "var"]
    system: Literal["hf", "ilab"]
    flags: tuple[str, ...] = ()  # ilab-train
    batch: int = 0  # samples per optimizer step (0: the group's)
    batch_len: int = MAX_BATCH_LEN  # ilab-train --max-batch-len
    collator: Literal["stack", "pad", "flat"] = "stack"  # HF
    per_device: int = FIXED_BATCH  # HF per_device_train_batch_size
    grad_accum: int = 1  # HF gradient_accumulation_steps
    liger: bool = False  # HF use_liger_kernel
    compiles: bool = False  # may compile: the longer warmup (HF: also torch_compile=True)
    smoke: bool = False  # in the --cpu-smoke set
    in_best: bool = True  # counts for the best-row comparisons

    @property
    def samples(self) -> int:
        return self.batch or (FIXED_BATCH if self.group == "fixed" else VAR_BATCH)


OFF = ilab_flags("off", "off", "off")
ALL = ilab_flags("on", "auto", "on")
CONFIGS = [
    Config("hf", "fixed", "hf", smoke=True),
    Config("hf+compile", "fixed", "hf", compiles=True),
    Config("hf+liger", "fixed", "hf", liger=True, smoke=True),
    Config("ilab", "fixed", "ilab", OFF, smoke=True),
    Config("ilab+packing", "fixed", "ilab", ilab_flags("on", "off", "off")),
    Config("ilab+fused", "fixed", "ilab", ilab_flags("off", "auto", "off")),
    Config("ilab+compile", "fixed", "ilab", ilab_flags("off", "off", "on"), compiles=True),
    Config("ilab+all", "fixed", "ilab", ALL, compiles=True),
    Config("ilab-default", "fixed", "ilab", compiles=True, smoke=True),
    Config("hf-var", "var", "hf", collator="pad", per_device=8, grad_accum=2, smoke=True),
    Config("hf-var+flat", "var", "hf", collator="flat", per_device=16, smoke=True),
    Config("hf-var+flat+liger", "var", "hf", collator="flat", per_device=16, liger=True),
    Config("ilab-var", "var", "ilab", OFF, smoke=True),
    Config("ilab-var+packing", "var", "ilab", ilab_flags("on", "off", "off")),
    Config("ilab-var+all", "var", "ilab", ALL, compiles=True),
    Config("ilab-var-default", "var", "ilab", compiles=True, smoke=True),
    Config(
        "ilab-var+all-32k",
        "var",
        "ilab",
        ALL,
        batch=BATCH_32K,
        batch_len=32768,
        compiles=True,
        in_best=False,
    ),
]


@dataclass
class Row:
    """One configuration's result (a JSON row)."""

    config: str
    group: str
    system: str
    status: str = "ok"  # ok | failed | timeout | skipped
    reason: str | None = None
    tokens_per_s: float | None = None  # real tokens / summed step time of the timed steps
    tokens_per_s_wall: float | None = None  # real tokens / step-end to step-end wall time
    mfu_pct: float | None = None
    peak_mem_gib: float | None = None
    peak_mem_source: str | None = None
    padding_pct: float | None = None
    padding_source: str | None = None
    x_ref: float | None = None  # fixed: vs hf+liger; var: vs the best HF var row
    x_hf: float | None = None  # fixed: vs hf; var: vs hf-var
    samples_per_step: int = 0
    warmup_steps: int = 0
    timed_steps: int = 0
    step_time_s: float | None = None  # mean over the timed steps
    final_loss: float | None = None
    wall_s: float | None = None  # the whole subprocess
    command: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Ctx:
    """What every configuration's run needs."""

    args: argparse.Namespace
    tmp: Path
    model: Path
    data: dict[str, Path]
    cuda: bool
    n_params: int
    peak_flops: float | None
    device: str
    out: TextIO  # the progress table (stderr under --json)


class Failed(Exception):
    """A configuration ran but produced no measurement (the message is the row's reason)."""


# -- the children: model + matmul peak, and one HF Trainer run ------------------------------


def child_prepare(spec: dict[str, Any]) -> dict[str, Any]:
    """Save the random model in bf16; on CUDA, measure the bf16 matmul peak."""
    import torch
    import transformers

    transformers.utils.logging.set_verbosity_error()
    cuda = spec["cuda"]
    torch.manual_seed(0)
    with torch.device("cuda" if cuda else "cpu"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**spec["model_config"]))
    model.to(torch.bfloat16).save_pretrained(spec["model_dir"])
    del model
    if not cuda:
        return {"device": "cpu"}
    torch.cuda.empty_cache()
    props = torch.cuda.get_device_properties(0)
    return {
        "device": torch.cuda.get_device_name(0),
        "gpu_mem_gib": props.total_memory / GIB,
        "capability": ".".join(map(str, torch.cuda.get_device_capability(0))),
        "peak_flops": matmul_peak(),
    }


def matmul_peak(n: int = 8192, warmup: int = 3, iters: int = 10) -> float:
    """FLOP/s of an n x n x n bf16 matmul: the mean of ``iters`` after ``warmup`` runs."""
    import torch

    a, b = (torch.randn(n, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    c = torch.empty_like(a)
    for _ in range(warmup):
        torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        torch.matmul(a, b, out=c)
    end.record()
    end.synchronize()
    return 2 * n**3 / (start.elapsed_time(end) / 1000 / iters)


Collate = Callable[[list[dict[str, Any]]], tuple[dict[str, Any], int, int]]


def hf_collator(kind: str) -> Collate:
    """A collator returning (batch, real tokens, tokens incl. padding)."""
    import torch

    if kind == "flat":
        from transformers import DataCollatorWithFlattening

        flat = DataCollatorWithFlattening()  # labels: -100 at each row start, position_ids

        def flatten(features: list[dict[str, Any]]) -> tuple[dict[str, Any], int, int]:
            batch = flat(features)
            n = int(batch["input_ids"].numel())
            return batch, n, n

        return flatten
    if kind == "pad":

        def pad(features: list[dict[str, Any]]) -> tuple[dict[str, Any], int, int]:
            rows = [f["input_ids"] for f in features]
            width = max(len(r) for r in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            labels = torch.full_like(ids, -100)
            mask = torch.zeros_like(ids)
            for i, r in enumerate(rows):
                ids[i, : len(r)], labels[i, : len(r)], mask[i, : len(r)] = r, r, 1
            batch = {"input_ids": ids, "attention_mask": mask, "labels": labels}
            return batch, int(mask.sum()), ids.numel()

        return pad

    def stack(features: list[dict[str, Any]]) -> tuple[dict[str, Any], int, int]:
        ids = torch.stack([f["input_ids"] for f in features])
        return {"input_ids": ids, "labels": ids.clone()}, ids.numel(), ids.numel()

    return stack


def child_hf(spec: dict[str, Any]) -> dict[str, Any]:
    """One HF Trainer run; returns the raw timings and token counts (the parent reduces)."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Trainer, TrainerCallback, TrainingArguments

    transformers.utils.logging.set_verbosity_warning()
    cuda, warmup = spec["cuda"], spec["warmup"]
    with open(spec["data"]) as f:
        rows = [{"input_ids": torch.tensor(json.loads(line)["input_ids"])} for line in f]
    seen: list[tuple[int, int]] = []  # (real, padded) tokens of every collated micro-batch
    collate = hf_collator(spec["collator"])

    def counted(features: list[dict[str, Any]]) -> dict[str, Any]:
        batch, real, padded = collate(features)
        seen.append((real, padded))
        return batch

    def now() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    class StepTimer(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.begins: list[float] = []
            self.ends: list[float] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if cuda and state.global_step == warmup:
                torch.cuda.reset_peak_memory_stats()
            self.begins.append(now())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.ends.append(now())

    model = AutoModelForCausalLM.from_pretrained(
        spec["model"], dtype=torch.float32, attn_implementation=spec["attn"]
    )
    args = TrainingArguments(
        output_dir=spec["out"],
        per_device_train_batch_size=spec["per_device"],
        gradient_accumulation_steps=spec["grad_accum"],
        max_steps=spec["total_steps"],
        learning_rate=LR,
        weight_decay=0.0,
        optim=spec["optim"],
        bf16=cuda,
        use_cpu=not cuda,
        torch_compile=spec["compile"],
        use_liger_kernel=spec["liger"],
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,  # the collator's token counts stay in this process
        remove_unused_columns=False,
        seed=SEED,
        data_seed=SEED,
    )
    timer = StepTimer()
    trainer = Trainer(
        model=model, args=args, train_dataset=rows, data_collator=counted, callbacks=[timer]
    )
    trainer.train()
    masking = importlib.import_module("transformers.masking_utils")
    return {
        "begins": timer.begins,
        "ends": timer.ends,
        "seen": seen,
        "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
        "peak_alloc": torch.cuda.max_memory_allocated() if cuda else None,
        "peak_reserved": torch.cuda.max_memory_reserved() if cuda else None,
        "attn_implementation": trainer.model.config._attn_implementation,
        "sdpa_packed_position_ids": hasattr(masking, "find_packed_sequence_indices"),
        "flash_attn_installed": importlib.util.find_spec("flash_attn") is not None,
        "optim": str(getattr(args.optim, "value", args.optim)),
        "liger_patched_modules": sum(1 for m in trainer.model.modules() if _liger(m)),
        "torch_compile": args.torch_compile,
    }


def _liger(module: Any) -> bool:
    fwd = getattr(module, "forward", None)
    return "liger" in type(module).__module__ or "liger" in getattr(fwd, "__module__", "")


CHILDREN: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "prepare": child_prepare,
    "hf": child_hf,
}


# -- subprocesses ---------------------------------------------------------------------------


@dataclass
class Proc:
    rc: int | None  # None: killed at the time limit
    out: str
    err: str
    wall_s: float


def run_proc(cmd: list[str], log_dir: Path, timeout: float, env: dict[str, str]) -> Proc:
    """Run ``cmd`` in its own process group, output to files; stop the group at ``timeout``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_p, err_p = log_dir / "stdout.txt", log_dir / "stderr.txt"
    t = time.perf_counter()
    with open(out_p, "w") as out, open(err_p, "w") as err:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=err, cwd=REPO, env=env, start_new_session=True
        )
        try:
            rc: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stop_group(proc)
            rc = None
    read = {"errors": "replace"}
    return Proc(rc, out_p.read_text(**read), err_p.read_text(**read), time.perf_counter() - t)


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process group we started, then SIGKILL what is left of it."""
    for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            continue
    time.sleep(2)  # let the GPU memory of the killed processes go


def child_env(cuda: bool) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    if not cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def run_child(kind: str, spec: dict[str, Any], log_dir: Path, timeout: float) -> dict[str, Any]:
    """Run ``child_<kind>(spec)`` in a fresh interpreter; raises Failed with the reason."""
    log_dir.mkdir(parents=True, exist_ok=True)
    result = log_dir / "result.json"
    spec_path = log_dir / "spec.json"
    spec_path.write_text(json.dumps({**spec, "result": str(result)}))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, str(spec_path)]
    proc = run_proc(cmd, log_dir, timeout, child_env(spec["cuda"]))
    if proc.rc is None:
        raise Failed(f"timeout after {timeout:.0f} s")
    if proc.rc != 0 or not result.exists():
        raise Failed(failure_reason([proc.err, proc.out]))
    return dict(json.loads(result.read_text()))


def failure_reason(texts: list[str]) -> str:
    """One line: "CUDA out of memory" when any text says so, else the last error-like line
    (an exception, ``Error:``) of the first text that has one, else its last line."""
    if any(OOM.search(t) for t in texts):
        return "CUDA out of memory"
    for text in texts:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ERROR_LINE.search(ln)]
        if errors or lines:
            return (errors or lines)[-1][:240]
    return "no output"


# -- inputs -----------------------------------------------------------------------------------


def var_lengths(n: int, rng: random.Random) -> list[int]:
    """Log-normal lengths (median 542, mean ~663) clipped to [32, 2048]."""
    return [max(VAR_MIN, min(SEQ, round(rng.lognormvariate(VAR_MU, VAR_SIGMA)))) for _ in range(n)]


def write_rows(path: Path, lengths: list[int], vocab: int, rng: random.Random) -> None:
    ids = range(vocab)
    with open(path, "w") as f:
        for n in lengths:
            f.write(json.dumps({"input_ids": rng.choices(ids, k=n)}) + "\n")


def make_data(d: Path, steps: int, vocab: int) -> tuple[dict[str, Path], dict[str, Any]]:
    """The fixed- and variable-length JSONL files, enough rows for ``steps`` steps + 2."""
    rng = random.Random(SEED)
    fixed = [SEQ] * ((steps + 2) * FIXED_BATCH)
    var = var_lengths((steps + 2) * BATCH_32K, rng)
    paths = {"fixed": d / "fixed.jsonl", "var": d / "var.jsonl"}
    write_rows(paths["fixed"], fixed, vocab, rng)
    write_rows(paths["var"], var, vocab, rng)
    stats = {
        "fixed": {"rows": len(fixed), "length": SEQ},
        "var": {
            "rows": len(var),
            "mean_length": statistics.fmean(var),
            "median_length": statistics.median(var),
            "lognormal_mu": VAR_MU,
            "lognormal_sigma": VAR_SIGMA,
        },
    }
    return paths, stats


def param_count(model_config: dict[str, Any]) -> int:
    """Parameters of the model, counted on the meta device (no memory, no CUDA)."""
    import torch
    import transformers

    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model_config))
    return sum(p.numel() for p in model.parameters())


# -- one configuration ------------------------------------------------------------------------


def warmup_for(cfg: Config, args: argparse.Namespace) -> int:
    return args.compile_warmup if cfg.compiles else args.warmup


def run_config(cfg: Config, ctx: Ctx) -> Row:
    warmup = warmup_for(cfg, ctx.args)
    row = Row(cfg.name, cfg.group, cfg.system, samples_per_step=cfg.samples, warmup_steps=warmup)
    if cfg.liger and importlib.util.find_spec("liger_kernel") is None:
        row.status, row.reason = "skipped", "liger-kernel not installed"
        return row
    t = time.perf_counter()
    try:
        (run_hf if cfg.system == "hf" else run_ilab)(cfg, ctx, row)
    except Failed as exc:
        row.status = "timeout" if str(exc).startswith("timeout") else "failed"
        row.reason = str(exc)
    row.wall_s = time.perf_counter() - t
    if row.tokens_per_s and ctx.peak_flops:
        row.mfu_pct = 100 * row.tokens_per_s * 6 * ctx.n_params / ctx.peak_flops
    return row


def run_hf(cfg: Config, ctx: Ctx, row: Row) -> None:
    total = row.warmup_steps + ctx.args.steps
    out = ctx.tmp / "runs" / cfg.name
    spec = {
        "cuda": ctx.cuda,
        "model": str(ctx.model),
        "data": str(ctx.data[cfg.group]),
        "out": str(out / "trainer"),
        "collator": cfg.collator,
        "per_device": cfg.per_device,
        "grad_accum": cfg.grad_accum,
        "total_steps": total,
        "warmup": row.warmup_steps,
        "optim": ctx.args.hf_optim,
        "attn": ctx.args.hf_attn,
        "compile": cfg.compiles,
        "liger": cfg.liger,
    }
    shown = ("collator", "per_device", "grad_accum", "total_steps", "optim", "attn", "compile")
    row.command = "transformers.Trainer " + json.dumps({k: spec[k] for k in (*shown, "liger")})
    res = run_child("hf", spec, out, ctx.args.timeout)
    hf_reduce(res, cfg, row)


def hf_reduce(res: dict[str, Any], cfg: Config, row: Row) -> None:
    """Tokens/s, padding and peak memory of the timed steps of an HF run."""
    begins, ends, seen = res["begins"], res["ends"], res["seen"]
    warmup, ga = row.warmup_steps, cfg.grad_accum
    total = len(ends)
    if total <= warmup or len(seen) < total * ga:
        raise Failed(f"HF ran {total} steps / {len(seen)} batches; {warmup} warmup steps")
    real = [sum(r for r, _ in seen[i * ga : (i + 1) * ga]) for i in range(total)]
    padded = [sum(p for _, p in seen[i * ga : (i + 1) * ga]) for i in range(total)]
    timed = range(warmup, total)
    tokens = sum(real[i] for i in timed)
    step_s = [ends[i] - begins[i] for i in timed]
    row.timed_steps = len(step_s)
    row.step_time_s = statistics.fmean(step_s)
    row.tokens_per_s = tokens / sum(step_s)
    if warmup >= 1:
        row.tokens_per_s_wall = tokens / (ends[-1] - ends[warmup - 1])
    row.padding_pct = 100 * (1 - tokens / sum(padded[i] for i in timed))
    row.padding_source = "collated batches"
    if res["peak_alloc"] is not None:
        row.peak_mem_gib = res["peak_alloc"] / GIB
        row.peak_mem_source = "torch.cuda.max_memory_allocated (timed steps)"
    row.final_loss = res["losses"][-1] if res["losses"] else None
    keep = ("attn_implementation", "sdpa_packed_position_ids", "flash_attn_installed", "optim")
    row.details = {k: res[k] for k in (*keep, "liger_patched_modules", "torch_compile")}
    if res["peak_reserved"] is not None:
        row.details["peak_reserved_gib"] = res["peak_reserved"] / GIB


def ilab_command(cfg: Config, ctx: Ctx, ckpt: Path, conf: Path, total: int) -> list[str]:
    exe = Path(sys.executable).parent / "ilab-train"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "trainer.cli"]
    cmd += ["--config", str(conf), "--model-path", str(ctx.model)]
    cmd += ["--data", str(ctx.data[cfg.group]), "--ckpt-dir", str(ckpt)]
    cmd += ["--nproc-per-node", "1", "--batch-size", str(cfg.samples)]
    cmd += ["--max-batch-len", str(cfg.batch_len), "--lr", str(LR), "--warmup-steps", "0"]
    cmd += ["--max-steps", str(total), "--log-every", "1", "--resume", "never"]
    cmd += ["--seed", str(SEED), "--quiet", *cfg.flags]
    if not ctx.cuda:
        cmd += ["--backend", "gloo", "--mixed-precision", "fp32"]
    return cmd


def run_ilab(cfg: Config, ctx: Ctx, row: Row) -> None:
    out = ctx.tmp / "runs" / cfg.name
    ckpt = out / "ckpt"
    out.mkdir(parents=True, exist_ok=True)
    conf = out / "ilab.yaml"
    conf.write_text("save_final: false\nsave_at_epoch_end: false\nsave_hf: false\nkeep_last_n: 1\n")
    timed_end = row.warmup_steps + ctx.args.steps
    total = timed_end + ctx.args.profile
    cmd = ilab_command(cfg, ctx, ckpt, conf, total)
    if ctx.args.profile:  # extra steps after the timed ones, profiled (they run slower)
        cmd += ["--profile-steps", f"{timed_end + 1}:{total}"]
    row.command = " ".join(["ilab-train", *cmd[cmd.index("--config") :]])
    proc = run_proc(cmd, out, ctx.args.timeout, child_env(ctx.cuda))
    records = ilab_records(ckpt)
    end = next((r["data"] for r in records if r["event"] == "train_end"), None)
    logged = sum(r["event"] == "log" for r in records)
    if proc.rc is None:
        raise Failed(f"timeout after {ctx.args.timeout:.0f} s ({logged} of {total} steps logged)")
    if proc.rc != 0 or end is None or end.get("status") != "completed":
        texts = [ilab_error(end), proc.err, *ilab_logs(ckpt)]
        row.details["journal_steps_logged"] = logged
        raise Failed(failure_reason([t for t in texts if t]))
    ilab_reduce(records, cfg, ctx, row, timed_end)
    if ctx.args.profile:
        keep_profile(ckpt, cfg, row)


def keep_profile(ckpt: Path, cfg: Config, row: Row) -> None:
    """Copy rank 0's profile summary beside the results; its headline goes in the row."""
    found = sorted((ckpt / "logs" / "profile").glob("rank-0-steps-*.txt"))
    if not found:
        row.details["profile"] = "no profile written"
        return
    dest = RESULTS / "profiles" / f"{cfg.name}.txt"
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = found[0].read_text()
    dest.write_text(text)
    row.details["profile"] = text.splitlines()[0]
    print(f"  profile of {cfg.name}: {row.details['profile']} ({dest})", flush=True)


def ilab_records(ckpt: Path) -> list[dict[str, Any]]:
    from journal.read.reader import read_all
    from journal.rundir.paths import journal_path

    path = journal_path(ckpt)
    return list(read_all(path).records) if path.exists() else []


def ilab_error(end: dict[str, Any] | None) -> str:
    if not end or not (end.get("error_type") or end.get("error_message")):
        return ""
    return f"{end.get('error_type')}: {end.get('error_message')}\n{end.get('traceback') or ''}"


def ilab_logs(ckpt: Path) -> list[str]:
    """The tails of the workers' log files (what --quiet kept off the terminal)."""
    logs = sorted((ckpt / "logs").glob("**/*")) if (ckpt / "logs").is_dir() else []
    return [p.read_text(errors="replace")[-20000:] for p in logs if p.is_file()]


BEGIN_KEYS = {
    "config",
    "world_size",
    "nnodes",
    "device_type",
    "backend",
    "journal_detail",
    "resumed_from",
    "total_steps",
    "steps_per_epoch",
    "train_samples",
    "hostname",
    "pid",
    "versions",
}
SETTING = re.compile(r"pack|fused|compile|atten|loss|kernel")


def ilab_reduce(
    records: list[dict[str, Any]], cfg: Config, ctx: Ctx, row: Row, timed_end: int
) -> None:
    """Tokens/s, peak memory and padding of the timed steps (after the warmup, up to
    ``timed_end``: profiled steps come after it), from the journal."""
    logs = {r["step"]: r["data"] for r in records if r["event"] == "log"}
    ends = {r["step"]: r["ts"] for r in records if r["event"] == "step_end"}
    begin = next((r["data"] for r in records if r["event"] == "train_begin"), {})
    timed = [s for s in sorted(logs) if row.warmup_steps < s <= timed_end]
    if not timed:
        raise Failed(f"no log records after the {row.warmup_steps} warmup steps")
    data = [logs[s] for s in timed]
    tokens = sum(d["batch_metrics"]["total_length"] for d in data)
    step_s = [d["elapsed_time"] for d in data]
    row.timed_steps = len(timed)
    row.step_time_s = statistics.fmean(step_s)
    row.tokens_per_s = tokens / sum(step_s)
    if row.warmup_steps in ends and timed[-1] in ends:
        row.tokens_per_s_wall = tokens / (ends[timed[-1]] - ends[row.warmup_steps])
    row.final_loss = data[-1].get("loss")
    ilab_peak(data, row)
    ilab_padding(data, begin, cfg, ctx, row, timed)
    micro = [d["batch_metrics"]["num_minibatches"] for d in data]
    row.details["micro_batches_per_step"] = max(micro)
    row.details["real_tokens_per_micro_batch"] = tokens / sum(micro)
    conf = begin.get("config", {})
    row.details["settings"] = {k: v for k, v in conf.items() if SETTING.search(k)}
    extra = {k: v for k, v in begin.items() if k not in BEGIN_KEYS}
    if extra:
        row.details["train_begin"] = extra


def ilab_peak(data: list[dict[str, Any]], row: Row) -> None:
    peaks = [d.get("cuda_max_mem_allocated") for d in data]
    if all(p is not None for p in peaks):
        row.peak_mem_gib = max(peaks) / GIB
        row.peak_mem_source = "journal cuda_max_mem_allocated"
        return
    ends = [d.get("cuda_mem_allocated") for d in data]
    if all(e is not None for e in ends):
        row.peak_mem_gib = max(ends) / GIB
        row.peak_mem_source = (
            "journal cuda_mem_allocated (end of step, NOT the peak: cuda_max_mem_allocated missing)"
        )


def ilab_packing(cfg: Config, begin: dict[str, Any]) -> str | None:
    """'on'/'off' when known: the flag, else what train_begin's ``kernels`` says, else the
    journaled setting (a trainer without the option never packs); None when unknown."""
    if "--packing" in cfg.flags:
        return cfg.flags[cfg.flags.index("--packing") + 1]
    resolved = (begin.get("kernels") or {}).get("packing")
    if isinstance(resolved, bool):
        return "on" if resolved else "off"
    conf = begin.get("config", {})
    if "packing" not in conf:
        return "off"
    return conf["packing"] if conf["packing"] in ("on", "off") else None


def ilab_padding(
    data: list[dict[str, Any]],
    begin: dict[str, Any],
    cfg: Config,
    ctx: Ctx,
    row: Row,
    timed: list[int],
) -> None:
    """Padding from the journal if it says; else a replay of the StepPlanner (packing off)."""
    bm_pad = {k for d in data for k in d["batch_metrics"] if "pad" in k}
    for k in sorted(bm_pad):  # whatever the trainer journals about padding, summed
        row.details[f"journal_{k}"] = sum(d["batch_metrics"].get(k) or 0 for d in data)
    packing = ilab_packing(cfg, begin)
    if packing == "on":  # samples back to back in one row: nothing to pad
        row.padding_pct, row.padding_source = 0.0, "packing on (samples back to back)"
    if packing != "off":
        return
    try:
        from trainer.data.plan import StepPlanner, load_jsonl

        samples = load_jsonl(ctx.data[cfg.group], SEQ)
        planner = StepPlanner(samples, cfg.samples, cfg.batch_len, 1, 0, SEED)
        real = padded = 0
        for step in timed:
            for mb in planner.plan(0, step - 1).micro_batches:
                lengths = [planner.lengths[i] for i in mb]
                real += sum(lengths)
                padded += max(lengths, default=0) * len(lengths)
    except Exception as exc:  # the planner's API moved on: padding stays unknown
        row.details["padding_replay_error"] = f"{type(exc).__name__}: {exc}"
        return
    row.padding_pct = 100 * (1 - real / padded)
    row.padding_source = "StepPlanner replay (packing off)"


# -- the table, the targets, the JSON --------------------------------------------------------


def by_name(rows: list[Row]) -> dict[str, Row]:
    return {r.config: r for r in rows if r.status == "ok" and r.tokens_per_s}


def best(rows: list[Row], group: str, system: str) -> Row | None:
    best_rows = (
        r
        for r in by_name(rows).values()
        if r.group == group and r.system == system and in_best(r.config)
    )
    return max(best_rows, key=lambda r: r.tokens_per_s or 0.0, default=None)


def in_best(name: str) -> bool:
    return next((c.in_best for c in CONFIGS if c.name == name), True)


def ratio(a: Row | None, b: Row | None) -> float | None:
    if a is None or b is None or not a.tokens_per_s or not b.tokens_per_s:
        return None
    return a.tokens_per_s / b.tokens_per_s


def annotate(rows: list[Row]) -> None:
    """The x-columns: fixed rows vs hf+liger and hf; variable rows vs the best HF
    variable-length row and hf-var."""
    ok = by_name(rows)
    refs = {
        "fixed": (ok.get("hf+liger"), ok.get("hf")),
        "var": (best(rows, "var", "hf"), ok.get("hf-var")),
    }
    for r in rows:
        ref, hf = refs[r.group]
        r.x_ref, r.x_hf = ratio(r, ref), ratio(r, hf)


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


HEADER = (
    f"{'config':<20} {'tokens/s':>10} {'x ref':>6} {'x hf':>6} {'MFU %':>6} "
    f"{'peak GiB':>8} {'pad %':>6}  status"
)


def table_line(r: Row) -> str:
    status = r.status if r.reason is None else f"{r.status}: {r.reason}"
    if r.status == "ok" and (note := row_note(r)):
        status += f"  [{note}]"
    return (
        f"{r.config:<20} {fmt(r.tokens_per_s, ',.0f'):>10} {fmt(r.x_ref, '.2f'):>6} "
        f"{fmt(r.x_hf, '.2f'):>6} {fmt(r.mfu_pct, '.1f'):>6} {fmt(r.peak_mem_gib, '.1f'):>8} "
        f"{fmt(r.padding_pct, '.1f'):>6}  {status}"
    )


def row_note(r: Row) -> str:
    """What ran: ilab-train's journaled kernel choices, HF's attention and Liger patches."""
    d = r.details
    if r.system == "ilab":
        kernels = (d.get("train_begin") or {}).get("kernels") or {}
        return " ".join(f"{k}={v}" for k, v in kernels.items())
    parts = [f"attn={d.get('attn_implementation')}"]
    if d.get("liger_patched_modules"):
        parts.append(f"liger modules={d['liger_patched_modules']}")
    if d.get("torch_compile"):
        parts.append("compiled")
    return " ".join(parts)


def target(
    name: str, value: float | None, threshold: float, compared: str, missing: str
) -> dict[str, Any]:
    met = None if value is None else value >= threshold
    return {
        "target": name,
        "value": value,
        "threshold": threshold,
        "met": met,
        "compared": compared if value is not None else missing,
    }


def name(r: Row | None) -> str:
    return r.config if r else "?"


def targets(rows: list[Row]) -> tuple[list[dict[str, Any]], float | None]:
    """The acceptance targets of the issue, and the variable/fixed ratio."""
    ok = by_name(rows)
    bf, bv, hv = best(rows, "fixed", "ilab"), best(rows, "var", "ilab"), best(rows, "var", "hf")
    liger = ok.get("hf+liger")
    var_fixed = ratio(bv, bf)
    out = [
        target(
            "fixed: best ilab tokens/s >= 1.2x hf+liger",
            ratio(bf, liger),
            1.2,
            f"{name(bf)} vs hf+liger",
            "needs an ilab fixed row and hf+liger",
        ),
        target(
            "fixed: best ilab MFU >= 55 %",
            bf.mfu_pct if bf else None,
            55.0,
            f"{name(bf)}",
            "needs an ilab fixed row and the matmul peak",
        ),
        target(
            "variable: best ilab real tokens/s >= 0.9x best ilab fixed",
            var_fixed,
            0.9,
            f"{name(bv)} / {name(bf)}",
            "needs ilab fixed and variable rows",
        ),
        target(
            "variable: best ilab >= 2x best HF variable-length",
            ratio(bv, hv),
            2.0,
            f"{name(bv)} vs {name(hv)}",
            "needs ilab and HF variable-length rows",
        ),
    ]
    out.append(fits_target(rows))
    return out, var_fixed


def fits_target(rows: list[Row]) -> dict[str, Any]:
    """The 32k micro-batch acceptance: ilab-var+all-32k ran (peak memory) or why not."""
    r = next((r for r in rows if r.config == "ilab-var+all-32k"), None)
    if r is None:
        met, compared = None, "not run"
    elif r.status == "ok":
        per_mb = r.details.get("real_tokens_per_micro_batch", 0)
        met, compared = True, f"peak GiB; {per_mb:,.0f} real tokens per micro-batch"
    else:
        met, compared = False, f"{r.status}: {r.reason}"
    return {
        "target": "32k-token micro-batch fits (ilab-var+all-32k)",
        "value": r.peak_mem_gib if r else None,
        "threshold": None,
        "met": met,
        "compared": compared,
    }


def target_lines(tg: list[dict[str, Any]], var_fixed: float | None) -> list[str]:
    lines = [f"variable/fixed (best ilab real tokens/s): {fmt(var_fixed, '.3f')}  (target >= 0.9)"]
    for t in tg:
        mark = {True: "met", False: "NOT met", None: "n/a"}[t["met"]]
        lines.append(f"  [{mark:^7}] {t['target']}: {fmt(t['value'], '.3f')} ({t['compared']})")
    return lines


def document(ctx: Ctx, rows: list[Row], stats: dict[str, Any], complete: bool) -> dict[str, Any]:
    import torch
    import transformers

    tg, var_fixed = targets(rows)
    return {
        "complete": complete,
        "device": ctx.device,
        "peak_bf16_tflops": ctx.peak_flops / 1e12 if ctx.peak_flops else None,
        "model": "tiny Llama (--tiny)" if ctx.args.tiny else "TinyLlama-1.1B architecture",
        "n_params": ctx.n_params,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            **optional_versions(),
        },
        "steps": ctx.args.steps,
        "warmup": ctx.args.warmup,
        "compile_warmup": ctx.args.compile_warmup,
        "hf_optim": ctx.args.hf_optim,
        "hf_attn": ctx.args.hf_attn,
        "cpu_smoke": ctx.args.cpu_smoke,
        "data": stats,
        "variable_over_fixed": var_fixed,
        "targets": tg,
        "rows": [asdict(r) for r in rows],
    }


def optional_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("accelerate", "triton", "liger-kernel", "flash-attn"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def save(doc: dict[str, Any]) -> None:
    """The JSON as emit writes it (rewritten after every row)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"bench": NAME, **doc, "machine": machine()}, indent=2)
    (RESULTS / f"{NAME}.json").write_text(text + "\n")


def merged_rows(selected: list[Config]) -> list[Row]:
    """--merge: the earlier JSON's rows of the configurations not run now."""
    path = RESULTS / f"{NAME}.json"
    if not path.exists():
        return []
    names = {c.name for c in selected}
    known = {f.name for f in fields(Row)}
    old = json.loads(path.read_text())
    rows = []
    for r in old.get("rows", []):
        if r.get("config") not in names:
            row = Row(**{k: v for k, v in r.items() if k in known})
            row.details["merged_from"] = f"{old.get('device')} {old.get('machine', {}).get('date')}"
            rows.append(row)
    return rows


# -- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    ap = bench_parser(__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--only", metavar="REGEX", help="run only the configs whose name matches")
    ap.add_argument("--steps", type=int, help="timed steps per config (default 15; --quick 6)")
    ap.add_argument("--warmup", type=int, help="untimed first steps (default 3; --quick 2)")
    ap.add_argument(
        "--compile-warmup",
        type=int,
        help="untimed first steps of configs that may compile (default 5; --quick 4)",
    )
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per config (240)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer hidden-256 Llama")
    ap.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="prove the harness on CPU: --tiny, fp32, 2 timed steps, the smoke configs",
    )
    ap.add_argument("--merge", action="store_true", help="keep earlier rows not run now")
    ap.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="ilab-train rows: N more steps after the timed ones under torch.profiler "
        "(--profile-steps); their summary goes to benchmarks/results/profiles/CONFIG.txt",
    )
    ap.add_argument("--hf-optim", default="adamw_torch_fused", help="HF TrainingArguments.optim")
    ap.add_argument("--hf-attn", default="sdpa", help="HF attn_implementation")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "SPEC"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    smoke, quick = args.cpu_smoke, args.quick
    args.tiny = args.tiny or smoke
    for name, full, short, cpu in (
        ("steps", 15, 6, 2),
        ("warmup", 3, 2, 1),
        ("compile_warmup", 5, 4, 1),
    ):
        if getattr(args, name) is None:
            setattr(args, name, cpu if smoke else short if quick else full)
    if args.warmup < 1 or args.compile_warmup < 1 or args.steps < 1:
        ap.error("--steps, --warmup and --compile-warmup must be >= 1")
    return args


def order(row: Row) -> int:
    names = [c.name for c in CONFIGS]
    return names.index(row.config) if row.config in names else len(names)


def select(args: argparse.Namespace) -> list[Config]:
    if args.only:
        return [c for c in CONFIGS if re.search(args.only, c.name)]
    return [c for c in CONFIGS if c.smoke] if args.cpu_smoke else list(CONFIGS)


def prepare(
    args: argparse.Namespace, tmp: Path, cuda: bool, out: TextIO
) -> tuple[Ctx, dict[str, Any]]:
    model_config = TINY if args.tiny else TINYLLAMA
    margin = max(args.warmup, args.compile_warmup) + args.steps
    data, stats = make_data(tmp, margin, model_config["vocab_size"])
    spec = {"cuda": cuda, "model_config": model_config, "model_dir": str(tmp / "model")}
    what = "saving the model, measuring the bf16 matmul peak" if cuda else "saving the model"
    print(f"bench_gpu: {what} ({tmp})", file=out, flush=True)
    try:
        info = run_child("prepare", spec, tmp / "prepare", 600)
    except Failed as exc:
        raise SystemExit(f"bench_gpu: preparing the model failed: {exc}") from None
    ctx = Ctx(
        args=args,
        tmp=tmp,
        model=tmp / "model",
        data=data,
        cuda=cuda,
        n_params=param_count(model_config),
        peak_flops=info.get("peak_flops"),
        device=info["device"],
        out=out,
    )
    peak = f"{ctx.peak_flops / 1e12:,.0f} TFLOP/s bf16 matmul" if ctx.peak_flops else "no peak"
    print(f"bench_gpu: {ctx.device}, {peak}, {ctx.n_params / 1e9:.3f} B params", file=out)
    return ctx, stats


def main() -> int:
    args = parse_args()
    if args.child:
        kind, spec_path = args.child
        spec = json.loads(Path(spec_path).read_text())
        Path(spec["result"]).write_text(json.dumps(CHILDREN[kind](spec)))
        return 0
    import torch

    out = sys.stderr if args.json else sys.stdout
    cuda = torch.cuda.is_available() and not args.cpu_smoke
    if not cuda and not args.cpu_smoke:
        print("bench_gpu: no CUDA GPU here; skipped", file=out)
        save({"skipped": "no CUDA GPU"})
        if args.json:
            print(json.dumps({"bench": NAME, "skipped": "no CUDA GPU"}))
        return 0
    configs = select(args)
    rows = merged_rows(configs) if args.merge else []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        ctx, stats = prepare(args, Path(tmp), cuda, out)
        print(HEADER, file=out, flush=True)
        for cfg in configs:
            row = run_config(cfg, ctx)
            rows.append(row)
            rows.sort(key=order)
            annotate(rows)
            print(table_line(row), file=out, flush=True)
            save(document(ctx, rows, stats, complete=False))
    print("\n" + HEADER, file=out)
    for r in rows:
        print(table_line(r), file=out)
    print(
        "x ref: fixed rows vs hf+liger, variable rows vs the best HF variable-length row; "
        "x hf: vs hf / hf-var",
        file=out,
    )
    doc = document(ctx, rows, stats, complete=True)
    print("\n".join(target_lines(doc["targets"], doc["variable_over_fixed"])), file=out)
    out.flush()
    emit(NAME, doc, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
