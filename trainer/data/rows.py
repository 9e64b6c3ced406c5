"""What one row of training data may hold, checked without torch.

The byte-level tokenizer of the built-in model, the label convention (-100: no loss) and
the checks of a token row live here, free of torch, so that the launcher can check a data
file before any worker starts (``trainer.launch.data_check``) with the same code the workers load
it with (``trainer.data.plan.load_jsonl``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

#: The label of positions without a loss (prompts, padding): PyTorch's and HF's convention.
IGNORE_INDEX = -100
#: The built-in model's byte vocabulary: the 256 bytes, then padding and end of sequence.
PAD_ID = 256
EOS_ID = 257
VOCAB_SIZE = 258


class DataError(ValueError):
    """Bad training data; the message names the file and line."""


def encode(text: str) -> list[int]:
    """Byte-level tokenizer: UTF-8 bytes are the token ids."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """``(line number, line)`` of every non-blank line; an unreadable file is a DataError."""
    try:
        raw_lines = Path(path).read_bytes().splitlines()
    except OSError as exc:
        raise DataError(f"{path}: {exc.strerror}") from None
    for n, raw in enumerate(raw_lines, start=1):
        if raw.strip():
            yield n, raw


def json_object(raw: bytes, where: str) -> dict[str, Any]:
    """One JSONL line as an object, or a DataError naming ``where`` (file:line)."""
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object")
    return obj


def token_row(
    obj: dict[str, Any], where: str, vocab_size: int | None
) -> tuple[list[int], list[int]]:
    """``(input_ids, labels)`` of a ``{"input_ids", "labels"?}`` or ``{"text"}`` row (other
    keys, like the ``len`` of InstructLab's processed rows, are allowed), or a
    DataError naming ``where``. Token ids at or above ``vocab_size`` are errors: on CUDA
    they would be a device-side assert while the other ranks hang in a collective."""
    if "input_ids" in obj:
        ids = obj["input_ids"]
        labels = obj.get("labels", ids)
    elif isinstance(obj.get("text"), str):
        ids = [*encode(obj["text"]), EOS_ID]
        labels = ids
    else:
        raise DataError(f"{where}: needs 'input_ids' (and optional 'labels') or 'text'")
    if not (isinstance(ids, list) and ids and all(type(i) is int and i >= 0 for i in ids)):
        raise DataError(f"{where}: 'input_ids' must be a non-empty list of token ids")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise DataError(f"{where}: token id {max(ids)} >= vocabulary size {vocab_size}")
    if not (isinstance(labels, list) and len(labels) == len(ids)):
        raise DataError(f"{where}: 'labels' must be a list as long as 'input_ids'")
    if not all(type(x) is int and (x == IGNORE_INDEX or x >= 0) for x in labels):
        raise DataError(f"{where}: 'labels' must be token ids or -100")
    if vocab_size is not None and max(labels) >= vocab_size:
        raise DataError(f"{where}: label {max(labels)} >= vocabulary size {vocab_size}")
    # InstructLab's processed rows carry their length; one that disagrees is a broken file.
    if "len" in obj and obj["len"] != len(ids):
        raise DataError(f"{where}: 'len' is {obj['len']!r} but 'input_ids' has {len(ids)} tokens")
    return ids, labels
