"""The launcher's look at the data before any worker starts.

A data mistake found inside the workers reaches the user through torchrun, after process
groups and models are set up. Found here it is one line naming ``file:line`` (``ilab-train``
exits 2). The rows are checked with the workers' own checks (:mod:`trainer.data.rows`, and the
structure of chat rows from :mod:`trainer.data.chat`) without torch; what only a tokenizer can
tell (a chat template that is not prefix-stable, rows too long after templating) is still
found by the workers. The row counts also give the warnings of settings that silently do
less than they say.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.config import ConfigError, TrainingArgs
from trainer.config.fields import parse_profile_steps
from trainer.data import chat
from trainer.data.rows import VOCAB_SIZE, DataError, json_object, numbered_lines, token_row
from trainer.data.validation_split import held_out, held_out_count


@dataclass(frozen=True)
class DataSummary:
    """What the launcher knows of the data: rows per file (chat rows before templating)."""

    train_rows: int
    chat: bool  # chat rows: some may still be dropped as too long after templating


def hf_setting(args: TrainingArgs, *keys: str) -> tuple[str, int] | None:
    """The first of ``keys`` the HF model's config.json holds as a positive int (or its
    ``text_config`` does), as ``(key, value)``: read without loading anything. None for
    the built-in model, a .gguf file, or a config that does not say."""
    if args.model_path is None:
        return None
    try:
        config: Any = json.loads((Path(args.model_path) / "config.json").read_text())
        for part in (config, config.get("text_config") or {}):
            for key in keys:
                value = part.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return key, value
    except (OSError, ValueError, AttributeError):
        pass
    return None


def vocab_size(args: TrainingArgs) -> int | None:
    """The model's vocabulary size, where it can be read without loading anything (None:
    the workers check token ids against the loaded model)."""
    if args.model_path is None:
        return VOCAB_SIZE
    found = hf_setting(args, "vocab_size")
    return found[1] if found else None


def check_file(path: Path, vocab: int | None, has_tokenizer: bool) -> tuple[int, bool]:
    """Check every row of a data file; returns (rows, whether they are chat rows). Raises
    :class:`DataError` naming ``file:line`` at the first bad row."""
    is_chat = chat.is_chat_file(path)
    if is_chat and not has_tokenizer:
        raise DataError(f"{path}: chat (messages) data needs --model-path with a tokenizer")
    rows = 0
    for n, raw in numbered_lines(path):
        where = f"{path}:{n}"
        obj = json_object(raw, where)
        if is_chat:
            chat.check_messages(obj, where)
        else:
            token_row(obj, where, vocab)
        rows += 1
    if not rows:
        raise DataError(f"{path}: no samples")
    return rows, is_chat


def check_data(args: TrainingArgs) -> DataSummary:
    """Check the training and validation files (the demo's are generated: nothing to check),
    then the settings against them (:func:`check_against_data`)."""
    vocab = vocab_size(args)
    has_tokenizer = args.model_path is not None
    if args.val_data_path is not None:
        check_file(Path(args.val_data_path), vocab, has_tokenizer)
    if args.demo or args.data_path is None:
        summary = DataSummary(args.demo_samples, chat=False)
    else:
        rows, is_chat = check_file(Path(args.data_path), vocab, has_tokenizer)
        if args.validation_split and not is_chat:  # chat rows may still drop: workers check
            held_out(rows, args.validation_split, args.seed)  # DataError: nothing to train on
        summary = DataSummary(rows, is_chat)
    check_against_data(args, summary)
    return summary


def _steps(args: TrainingArgs, data: DataSummary) -> tuple[int, int, int, str]:
    """``(training samples, steps per epoch, the run's last step)`` as the data allows,
    and why that is the last step; chat rows too long after templating are dropped by the
    workers, so for chat data these are upper bounds."""
    train_rows = data.train_rows - held_out_count(data.train_rows, args.validation_split)
    per_epoch = train_rows // args.effective_batch_size
    last = per_epoch * args.num_epochs
    why = (
        f"{args.num_epochs} epoch(s) of {per_epoch} steps: {train_rows} samples / batch size "
        f"{args.effective_batch_size}"
    )
    if args.max_steps is not None and args.max_steps <= last:
        last, why = args.max_steps, f"--max-steps {args.max_steps}"
    return train_rows, per_epoch, last, why


def check_against_data(args: TrainingArgs, data: DataSummary) -> None:
    """Raise :class:`ConfigError` (one line) for settings the data rules out: they would
    fail in every worker, or silently do nothing."""
    train_rows, _, last, why = _steps(args, data)
    if args.effective_batch_size > train_rows:
        raise ConfigError(
            f"effective_batch_size (--batch-size) {args.effective_batch_size} is more than the "
            f"{train_rows} training samples: one optimizer step takes that many samples (at "
            f"most {train_rows} here)"
        )
    if args.profile_steps is not None:
        first, _ = parse_profile_steps(args.profile_steps)
        if first > last:
            most = "at most " if data.chat else ""  # chat rows may still be dropped
            raise ConfigError(
                f"--profile-steps {args.profile_steps} starts after the run's last step, "
                f"{most}{last} ({why}): nothing would be profiled (give steps within 1:{last})"
            )


def start_warnings(args: TrainingArgs, data: DataSummary) -> list[str]:
    """Settings that silently do less than they say, one line each."""
    out = []
    no_val = args.val_data_path is None and not args.demo and not args.validation_split
    if args.eval_every is not None and no_val:
        out.append(
            f"--eval-every {args.eval_every} has no validation data to evaluate: no evaluate "
            "records will be written (give --val-data FILE)"
        )
    if args.validation_split and args.eval_every is None:
        out.append(
            f"--validation-split {args.validation_split} holds data out but nothing evaluates "
            "on it: give --eval-every N"
        )
    train_rows, steps_per_epoch, _, _ = _steps(args, data)
    epoch_steps = steps_per_epoch * args.num_epochs
    if args.max_steps and steps_per_epoch and args.max_steps > epoch_steps:
        # chat rows too long after templating are dropped by the workers: fewer steps still
        most = "at most " if data.chat else ""
        out.append(
            f"--max-steps {args.max_steps} is more than {args.num_epochs} epoch(s) of "
            f"{most}{steps_per_epoch} steps ({train_rows} samples / batch size "
            f"{args.effective_batch_size}): training ends at step {most}{epoch_steps} "
            f"(--num-epochs {-(-args.max_steps // steps_per_epoch)} trains all "
            f"{args.max_steps} steps)"
        )
    return out
