"""LoRA (peft) on a Hugging Face model: adapters injected before sharding, the base frozen.

The adapters are put into the model in place (``peft.inject_adapter_in_model``), before
``fully_shard``: the parameter names stay the HF model's (a wrapped Linear's weight becomes
``<module>.base_layer.weight`` beside ``<module>.lora_A.default.weight``), so the FSDP units,
the training forward and the DCP checkpoint work as for a full fine-tune. Only the adapter
parameters require grad, so the optimizer (:func:`trainer.model.optim.build_optimizer`) holds fp32
masters and AdamW state for them alone; the base weights never change. The DCP checkpoint
holds the whole model (base included), so a resume is exact and needs nothing else.

The export (``hf/`` of a checkpoint) is either the adapter in peft's format
(``adapter_config.json`` + ``adapter_model.safetensors``, for ``PeftModel.from_pretrained``
on the base model) or, with ``lora_merge``, the base model with ``W + alpha/r * B @ A`` merged
in (a plain model for ``from_pretrained``). The ``save`` record's ``export`` names which.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from trainer.config import TrainingArgs
from trainer.model.spec import ConsolidatedWriter, ModelParts

ADAPTER = "default"  # peft's adapter name; its files drop it from the keys
_LORA_KEY = f".lora_A.{ADAPTER}.weight"

ExportKind = Literal["full", "adapter", "merged"]


def export_kind(args: TrainingArgs) -> ExportKind:
    """What a checkpoint's ``hf/`` holds: the whole model, the LoRA adapter, or the merged model."""
    if args.lora_rank is None:
        return "full"
    return "merged" if args.lora_merge else "adapter"


def _peft() -> Any:
    try:
        import peft
    except ImportError:
        raise RuntimeError("lora_rank needs peft: pip install 'ilab-journal[hf]'") from None
    return peft


def lora_config(args: TrainingArgs, base_path: Path | None = None) -> Any:
    """peft's ``LoraConfig`` for these settings (``target_modules`` None: peft's default for
    the architecture, filled in when the adapters are injected)."""
    return _peft().LoraConfig(
        r=args.lora_rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.lora_target_modules,
        task_type="CAUSAL_LM",
        base_model_name_or_path=str(base_path.resolve()) if base_path else None,
    )


def add_adapters(model: nn.Module, args: TrainingArgs) -> nn.Module:
    """Inject the adapters in place and freeze everything else. A target that names no
    module, or a module peft cannot wrap, is a ValueError from peft (one line)."""
    _peft().inject_adapter_in_model(lora_config(args), model, adapter_name=ADAPTER)
    for name, p in model.named_parameters():
        p.requires_grad_(".lora_" in name)
    return model


def adapter_state(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter tensors under the keys of peft's ``adapter_model.safetensors``."""
    return {
        "base_model.model." + name.replace(f".{ADAPTER}.", "."): t
        for name, t in state_dict.items()
        if ".lora_" in name
    }


def merged_state(state_dict: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """The base model's state dict with each adapter merged into its weight
    (``W + scale * B @ A``, in fp32), under the HF model's own names."""
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        if ".lora_" not in name:
            out[name.replace(".base_layer.", ".")] = t
    for name, a in state_dict.items():
        if name.endswith(_LORA_KEY):
            module = name.removesuffix(_LORA_KEY)
            b = state_dict[f"{module}.lora_B.{ADAPTER}.weight"]
            w = out[f"{module}.weight"]
            out[f"{module}.weight"] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)
    return out


def with_adapters(
    parts: ModelParts, args: TrainingArgs, base_path: Path, dtype: torch.dtype
) -> ModelParts:
    """An HF model's :class:`~trainer.model.spec.ModelParts` for a LoRA run: every build gets the
    adapters (the meta one and rank 0's full one alike), the export is :func:`lora_writer`'s."""

    def make() -> nn.Module:
        return add_adapters(parts.make(), args)

    def writer(tied: set[str]) -> ConsolidatedWriter:
        return lora_writer(args, parts.writer(tied), base_path, dtype)

    return replace(parts, make=make, writer=writer)


def lora_writer(
    args: TrainingArgs, base_writer: ConsolidatedWriter, base_path: Path, dtype: torch.dtype
) -> ConsolidatedWriter:
    """The export of a LoRA run: the merged model through ``base_writer``, or the adapter."""
    scale = float(args.lora_alpha) / float(args.lora_rank or 1)

    def write(out_dir: Path, state_dict: dict[str, Any]) -> None:
        if args.lora_merge:
            base_writer(out_dir, merged_state(state_dict, scale))
        else:
            save_adapter(args, out_dir, state_dict, base_path, dtype)

    return write


def save_adapter(
    args: TrainingArgs,
    out_dir: Path,
    state_dict: dict[str, torch.Tensor],
    base_path: Path,
    dtype: torch.dtype,
) -> None:
    """``adapter_config.json`` + ``adapter_model.safetensors`` as ``PeftModel.save_pretrained``
    writes them, and the base model's tokenizer files beside them."""
    from safetensors.torch import save_file

    from trainer.model.hf_model import TOKENIZER_FILES

    out_dir.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: t.detach().to("cpu", dtype).contiguous() for k, t in adapter_state(state_dict).items()
    }
    config = lora_config(args, base_path)
    config.target_modules = sorted(_targets(state_dict))  # what was wrapped, not a default
    config.save_pretrained(str(out_dir))
    save_file(tensors, str(out_dir / "adapter_model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if (base_path / name).is_file():
            shutil.copy2(base_path / name, out_dir / name)


def _targets(state_dict: dict[str, torch.Tensor]) -> set[str]:
    return {
        n.removesuffix(_LORA_KEY).rsplit(".", 1)[-1] for n in state_dict if n.endswith(_LORA_KEY)
    }
