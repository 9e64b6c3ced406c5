"""Hugging Face causal LMs from a local directory: config, build, sharding units, export.

Weights are always built in fp32, whatever ``dtype`` the config declares (real checkpoints
say bfloat16, and transformers loads that dtype by default): AdamW on bf16 weights rounds
away updates smaller than ~0.4 % of a weight. bf16 is for compute only, through FSDP's
``MixedPrecisionPolicy``.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import torch
from torch import nn

#: What ``save_pretrained`` of a tokenizer writes (the chat template included).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "generation_config.json",
)


def load_transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise RuntimeError(
            "model_path needs transformers: pip install 'ilab-journal[hf]'"
        ) from None
    transformers.utils.logging.disable_progress_bar()  # bars in rank logs are noise
    return transformers


def hf_config(model_path: Path) -> Any:
    """The model's ``PretrainedConfig`` (local files only; nothing is downloaded)."""
    return load_transformers().AutoConfig.from_pretrained(model_path, local_files_only=True)


def context_length(config: Any) -> int | None:
    """The longest sequence the model was built for (None when the config does not say)."""
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def declared_dtype(config: Any) -> torch.dtype:
    """The dtype the config declares for its weights (fp32 when it says nothing)."""
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(value, str):
        value = getattr(torch, value, None)
    return value if isinstance(value, torch.dtype) else torch.float32


def build_hf_model(
    model_path: Path, config: Any | None = None, attn_implementation: str | None = None
) -> nn.Module:
    """The whole model in fp32: pretrained weights when the dir has them, else random init.
    ``attn_implementation`` (e.g. :data:`trainer.model.attention.HF_ATTENTION`) must be registered
    with transformers first."""
    tf = load_transformers()
    kw: dict[str, Any] = {"dtype": torch.float32}
    if attn_implementation is not None:
        kw["attn_implementation"] = attn_implementation
    if any(model_path.glob("*.safetensors")) or any(model_path.glob("*.bin")):  # has weights
        return tf.AutoModelForCausalLM.from_pretrained(model_path, local_files_only=True, **kw)
    return tf.AutoModelForCausalLM.from_config(config or hf_config(model_path), **kw)


def hf_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of an HF causal LM (what FSDP shards one by one): the
    ModuleList holding ``num_hidden_layers`` modules, wherever the architecture keeps it."""
    n = getattr(model.config, "num_hidden_layers", None)
    for _, mod in model.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) == n:
            return mod
    raise RuntimeError(f"cannot find the {n} decoder layers of {type(model).__name__}")


def hf_shard_units(model: Any) -> list[list[nn.Module]]:
    """Units besides the blocks, as torchtitan's ``apply_fsdp``: the input embeddings, and
    the final norm with the head. Tied embeddings share one weight, which must stay in one
    unit: then both stay in the root unit."""
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    if embed is None or head is None or head.weight is embed.weight:
        return []
    norm = getattr(model.base_model, "norm", None)
    last = [norm, head] if isinstance(norm, nn.Module) else [head]
    return [[embed], last]


def save_hf_consolidated(
    config: Any,
    out_dir: Path,
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    drop: set[str] | frozenset[str] = frozenset(),
    source: Path | None = None,
) -> None:
    """``config.json`` + ``model.safetensors`` loadable with ``AutoModelForCausalLM.from_pretrained``.

    Tied weights (e.g. lm_head tied to the embeddings) are saved once, as ``save_pretrained``
    does: ``drop`` names the second names of tied parameters (a gathered state dict may hold
    them as copies), and tensors sharing storage are kept under their first name. Loading
    re-ties them. The tokenizer and chat template of ``source`` (the model dir trained
    from) are copied beside it, so the export is a complete model for ``from_pretrained``.
    """
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.dtype = str(dtype).removeprefix("torch.")  # what the saved weights are
    config.save_pretrained(out_dir)
    seen: set[int] = set()
    tensors = {}
    for name, t in state_dict.items():
        ptr = t.untyped_storage().data_ptr()
        if name in drop or ptr in seen:
            continue
        seen.add(ptr)
        tensors[name] = t.detach().to("cpu", dtype).contiguous()
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    for name in TOKENIZER_FILES:
        if source is not None and (source / name).is_file():
            shutil.copy2(source / name, out_dir / name)
