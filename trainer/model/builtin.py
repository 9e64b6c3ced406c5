"""The built-in model: a small decoder-only transformer over bytes, plus optional HF models.

nanoGPT-shaped on purpose: one screen per class, no magic. ``blocks`` is what FSDP shards.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from trainer.config import ModelConfig
from trainer.data.rows import EOS_ID, IGNORE_INDEX, PAD_ID, VOCAB_SIZE, decode, encode
from trainer.model.attention import attend
from trainer.model.lm_head import LossHead


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        d_ff = cfg.d_ff or 4 * cfg.d_model
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, d_ff), nn.GELU(), nn.Linear(d_ff, cfg.d_model)
        )
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor, **attention: Any) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2) for z in (q, k, v))
        y = attend(q, k, v, dropout=self.dropout if self.training else 0.0, **attention)
        x = x + self.proj(y.reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Decoder-only transformer with learned positions and a byte vocabulary."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = LossHead(nn.Linear(cfg.d_model, VOCAB_SIZE, bias=False))
        self.apply(self._init)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cu_seq_lens_q: torch.Tensor | None = None,
        max_length_q: int | None = None,
        **_unused: Any,
    ) -> torch.Tensor:
        """Logits, or with ``targets`` (next-token labels, -100 = none) the summed loss.
        ``position_ids`` and the attention keywords describe a packed row (see
        :mod:`trainer.model.attention`)."""
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok_emb(input_ids) + self.pos_emb(position_ids)
        attention = {
            "attention_mask": attention_mask,
            "cu_seqlens": cu_seq_lens_q,
            "max_len": max_length_q,
        }
        for block in self.blocks:
            x = block(x, **attention)
        return cast(torch.Tensor, self.head(self.ln_f(x), targets))

    def get_output_embeddings(self) -> LossHead:
        """The output layer (HF's name for it): where the loss kernel is set."""
        return self.head

    def shard_units(self) -> list[list[nn.Module]]:
        """Groups FSDP shards as units of their own besides the blocks (so the root unit
        holds nothing for the whole step): the embeddings, and the final norm with the head."""
        return [[self.tok_emb, self.pos_emb], [self.ln_f, self.head]]


def loss_sum(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy of ``logits`` against next-token ``targets`` (a
    :class:`trainer.data.plan.Batch`'s: already shifted, -100 = no loss) and the number of
    loss-counted tokens. For models that return logits (an exported checkpoint)."""
    loss = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=IGNORE_INDEX,
        reduction="sum",
    )
    return loss, (targets != IGNORE_INDEX).sum()


# -- consolidated checkpoints (loadable without torchrun) ----------------------------------


def save_consolidated(
    out_dir: Path,
    state_dict: dict[str, torch.Tensor],
    cfg: dict[str, Any],
    dtype: torch.dtype = torch.float32,
) -> None:
    """Write ``model.safetensors`` + ``config.json`` (HF layout) from a full state dict."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in state_dict.items()}
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_consolidated(path: str | Path, device: str = "cpu") -> tuple[TinyGPT, ModelConfig]:
    """Load a consolidated built-in model from a checkpoint dir or its ``hf/`` subdir."""
    from safetensors.torch import load_file

    p = Path(path)
    if (p / "hf").is_dir():
        p = p / "hf"
    cfg_raw = json.loads((p / "config.json").read_text())
    if cfg_raw.get("model_type") != "ilab-tinygpt":
        raise ValueError(
            f"{p} holds a {cfg_raw.get('model_type')!r} model; load it with transformers"
        )
    cfg = ModelConfig(**cfg_raw["model"])
    model = TinyGPT(cfg)  # fp32; an export in bf16 is cast up on load
    model.load_state_dict(load_file(str(p / "model.safetensors"), device=device))
    return model.to(device).eval(), cfg


@torch.no_grad()
def greedy_generate(model: TinyGPT, prompt: str, max_new_tokens: int = 8) -> str:
    """Greedy decoding until EOS or a newline; returns the generated text."""
    ids = encode(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        x = torch.tensor([ids[-model.cfg.max_seq_len :]])
        nxt = int(model(x)[0, -1].argmax())
        if nxt in (EOS_ID, PAD_ID, ord("\n")):
            break
        ids.append(nxt)
        out.append(nxt)
    return decode(out)
