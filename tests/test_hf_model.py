"""A local Hugging Face causal LM (tiny Llama, tied embeddings) through the same loop."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import records, tiny_llama_config, train

pytestmark = pytest.mark.dist
transformers = pytest.importorskip("transformers")


def test_hf_model_trains_and_its_consolidated_checkpoint_loads_with_from_pretrained(
    tmp_path: Path,
) -> None:
    model_dir = tmp_path / "tiny-llama"
    tiny_llama_config().save_pretrained(model_dir)
    ckpt = tmp_path / "run"
    proc = train(
        ckpt,
        "--model-path",
        str(model_dir),
        "--max-steps",
        "6",
        "--save-every",
        "3",
        "--eval-every",
        "6",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    recs = records(ckpt)
    losses = [r["data"]["loss"] for r in recs if r["event"] == "log"]
    assert losses[-1] < losses[0]
    save = [r for r in recs if r["event"] == "save"][-1]
    assert save["data"]["kind"] == ["full_state", "hf"]
    val_loss = [r for r in recs if r["event"] == "evaluate"][-1]["data"]["val_loss"]
    code = f"""
import torch
from pathlib import Path
from transformers import AutoModelForCausalLM
from trainer.data.plan import StepPlanner, load_jsonl
from trainer.model.builtin import loss_sum
model = AutoModelForCausalLM.from_pretrained({save["data"]["hf_path"]!r}).eval()
assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # re-tied
val = load_jsonl(Path({str(ckpt / "demo_data" / "val.jsonl")!r}), 64)
pl = StepPlanner(val, len(val), 4096, 1, 0, 0)
batch = pl.collate(list(range(len(val))), torch.device("cpu"))
with torch.no_grad():
    loss, n = loss_sum(model(batch.input_ids).logits, batch.targets)
print(float(loss / n))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert float(out.stdout.strip().splitlines()[-1]) == pytest.approx(val_loss, rel=1e-3)
