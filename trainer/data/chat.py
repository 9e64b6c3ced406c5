"""Chat data: InstructLab ``messages`` JSONL, tokenized with the model's own chat template.

One row::

    {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...], ...}

Labels are -100 everywhere except on what the model must generate: for each assistant turn,
the tokens after the template's generation prompt up to and including its end-of-turn
marker (``train_on_all_tokens`` labels every token instead). The spans are found on the
rendered text: the conversation up to an assistant turn rendered with
``add_generation_prompt=True`` must be a prefix of the conversation including that turn
(true of ChatML, Llama and Granite templates; a template for which it is not is refused with
the row's ``file:line``). The whole conversation is tokenized once, with character offsets,
and a token is an assistant token when it starts inside an assistant span.

Rules for bad rows (``file:line`` in every message): unknown role, no assistant turn, empty
content, not a list of messages: an error. A row longer than ``max_seq_len`` tokens after
templating is **dropped and counted** (cutting it could remove the answer it teaches); the
count is logged and journaled, and no row left is an error.

The tokenized rows are cached in ``<ckpt_dir>/data_cache/`` under a key made of the data
file's contents, the tokenizer, the template and these settings, so a resume (or a second
run on the same data) does not tokenize again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from journal.rundir.files import atomic_write
from trainer.data.rows import IGNORE_INDEX, DataError, json_object, numbered_lines

ROLES = ("system", "user", "assistant")
CACHE_DIR = "data_cache"


@dataclass
class ChatStats:
    rows: int = 0  # rows read
    kept: int = 0  # rows tokenized and kept
    dropped_too_long: int = 0  # rows over max_seq_len after templating
    first_dropped: str | None = None  # file:line of the first dropped row


def is_chat_file(path: Path) -> bool:
    """Whether the first non-empty row of a JSONL file holds ``messages`` and no tokens (a
    row with ``input_ids`` is already tokenized, whatever else it keeps)."""
    try:
        with open(path, "rb") as f:
            for raw in f:
                if raw.strip():
                    try:
                        row = orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        return False
                    return isinstance(row, dict) and "messages" in row and "input_ids" not in row
    except OSError:
        return False
    return False


def check_messages(row: Any, where: str) -> list[dict[str, str]]:
    """The row's messages, or a DataError naming ``where`` (file:line)."""
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
        raise DataError(f"{where}: expected an object with a 'messages' list")
    messages = row["messages"]
    if not messages:
        raise DataError(f"{where}: 'messages' is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise DataError(f"{where}: message {i} is not an object")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise DataError(
                f"{where}: message {i} has role {role!r}; expected one of {', '.join(ROLES)}"
            )
        if not isinstance(content, str) or not content.strip():
            raise DataError(f"{where}: message {i} ({role}) has empty content")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{where}: no assistant message: nothing to learn from")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def assistant_spans(
    tokenizer: Any, messages: list[dict[str, str]], where: str
) -> list[tuple[int, int]]:
    """Character spans of the rendered conversation that the model must generate."""
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:i], tokenize=False, add_generation_prompt=True
        )
        turn = tokenizer.apply_chat_template(messages[: i + 1], tokenize=False)
        if not (turn.startswith(prompt) and full.startswith(turn)):
            raise DataError(
                f"{where}: the chat template does not render this conversation turn by turn "
                "(a prefix changes when a turn is added): assistant tokens cannot be found"
            )
        spans.append((len(prompt), len(turn)))
    return spans


def tokenize_row(
    tokenizer: Any, messages: list[dict[str, str]], where: str, train_on_all: bool
) -> tuple[list[int], list[int]]:
    """input_ids and labels of one conversation (labels -100 outside assistant spans)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    spans = assistant_spans(tokenizer, messages, where)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids: list[int] = list(enc["input_ids"])
    if train_on_all:
        return ids, list(ids)
    labels = [IGNORE_INDEX] * len(ids)
    for k, (start, _end) in enumerate(enc["offset_mapping"]):
        if any(a <= start < b for a, b in spans):
            labels[k] = ids[k]
    return ids, labels


def load_tokenizer(model_path: Path) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise DataError(f"chat data needs the model's tokenizer in {model_path}: {exc}") from None
    if not getattr(tok, "chat_template", None):
        raise DataError(f"the tokenizer in {model_path} has no chat template")
    if not getattr(tok, "is_fast", False):
        raise DataError(f"the tokenizer in {model_path} is not a fast tokenizer (offsets needed)")
    return tok


def tokenize_chat_file(
    path: Path, tokenizer: Any, max_seq_len: int, train_on_all: bool
) -> tuple[list[dict[str, list[int]]], ChatStats]:
    """Every row tokenized (rows over ``max_seq_len`` dropped and counted)."""
    stats = ChatStats()
    rows: list[dict[str, list[int]]] = []
    for n, raw in numbered_lines(path):  # the launcher's reading of a row (data_check)
        where = f"{path}:{n}"
        messages = check_messages(json_object(raw, where), where)
        stats.rows += 1
        ids, labels = tokenize_row(tokenizer, messages, where, train_on_all)
        if len(ids) > max_seq_len:
            stats.dropped_too_long += 1
            stats.first_dropped = stats.first_dropped or where
            continue
        rows.append({"input_ids": ids, "labels": labels})
    stats.kept = len(rows)
    if not rows:
        raise DataError(
            f"{path}: no row left: {stats.dropped_too_long} of {stats.rows} are longer than "
            f"max_seq_len {max_seq_len} after templating"
        )
    return rows, stats


def cache_key(path: Path, model_path: Path, max_seq_len: int, train_on_all: bool) -> str:
    """Hash of what the tokenized rows depend on."""
    h = hashlib.sha256()
    h.update(Path(path).read_bytes())
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        f = Path(model_path) / name
        if f.is_file():
            h.update(name.encode() + f.read_bytes())
    h.update(json.dumps([max_seq_len, train_on_all]).encode())
    return h.hexdigest()[:20]


def _cache_files(
    path: Path, model_path: Path, ckpt_dir: Path, max_seq_len: int, train_on_all: bool
) -> tuple[Path, Path]:
    """(tokenized rows, their stats) in the run's cache for these inputs and settings."""
    key = cache_key(path, model_path, max_seq_len, train_on_all)
    stem = Path(ckpt_dir) / CACHE_DIR / f"{Path(path).stem}-{key}"
    return stem.with_suffix(".jsonl"), stem.with_suffix(".json")


def prepare_chat_data(
    path: Path, model_path: Path, ckpt_dir: Path, max_seq_len: int, train_on_all: bool
) -> tuple[Path, ChatStats, bool]:
    """Tokenize ``path`` into the run's cache (once per node: call on local rank 0, then
    barrier). Returns the tokenized JSONL, the stats and whether the cache was hit."""
    out, meta = _cache_files(path, model_path, ckpt_dir, max_seq_len, train_on_all)
    if out.is_file() and meta.is_file():
        return out, ChatStats(**json.loads(meta.read_text())), True
    rows, stats = tokenize_chat_file(
        Path(path), load_tokenizer(model_path), max_seq_len, train_on_all
    )
    data = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)
    atomic_write(out, data, root=ckpt_dir, durable=False)  # first: a meta file means complete
    atomic_write(meta, json.dumps(stats.__dict__).encode(), root=ckpt_dir, durable=False)
    return out, stats, False


def cached_chat_data(
    path: Path, model_path: Path, ckpt_dir: Path, max_seq_len: int, train_on_all: bool
) -> tuple[Path, ChatStats]:
    """What :func:`prepare_chat_data` wrote (the other ranks, after the barrier)."""
    out, meta = _cache_files(path, model_path, ckpt_dir, max_seq_len, train_on_all)
    return out, ChatStats(**json.loads(meta.read_text()))
