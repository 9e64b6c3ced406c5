"""Reading checkpoint files without running code from them.

``torch.load(weights_only=False)`` and ``pickle.load`` run whatever a pickle says, so a
checkpoint planted in (or edited inside) a checkpoint dir would run code on resume. Here every
checkpoint file is read as data only:

- ``scheduler.json`` and ``trainer_state.json``: JSON. (Checkpoints of earlier versions have
  ``scheduler.pt`` instead: read with ``torch.load(weights_only=True)``.)
- ``rng_rank<r>.pt``: a dict of tensors, read with ``torch.load(weights_only=True)``.
- The DCP shards: tensors are read with ``weights_only=True`` by DCP itself; its other values
  (the optimizer's ``lr``, ``betas``, ...) go through :class:`SafeLoadPlanner`, and its
  ``.metadata`` pickle through :class:`SafeReader`, which accepts only DCP's own metadata
  classes and torch's value types.

A file that holds anything else is refused with :class:`CheckpointError`, naming the file.
"""

from __future__ import annotations

import io
import json
import pickle
import re
import sys
from dataclasses import is_dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

SCHEDULER_FILE = "scheduler.json"
LEGACY_SCHEDULER_FILE = "scheduler.pt"  # written by versions before scheduler.json
_DCP_PACKAGE = "torch.distributed.checkpoint"
#: Harmless classes the metadata may hold (DCP stores the checkpoint's path).
_PLAIN_CLASSES = frozenset(
    {
        ("pathlib", n)
        for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")
    }
    | {("collections", "OrderedDict")}
)


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be loaded safely (the message names the file)."""


def refusal(path: Path | str, detail: str) -> CheckpointError:
    """The one-line error for a checkpoint file that holds more than data."""
    return CheckpointError(
        f"{path}: refusing to load it: it holds {detail}, where a checkpoint holds only "
        "tensors and plain data (was it written by this trainer?)"
    )


def _what(exc: Exception) -> str:
    """The offending global of a weights_only error (torch's message is a page long)."""
    m = re.search(r"GLOBAL ([\w.]+)", str(exc))
    return m.group(1) if m else "Python objects"


def load_data(path: Path) -> Any:
    """``torch.load`` of tensors and plain data only; anything else is a CheckpointError."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise refusal(path, _what(exc)) from None


def write_scheduler_state(full_state: Path, state: dict[str, Any]) -> None:
    """The LR scheduler's state as JSON (LambdaLR's is numbers, lists and flags)."""
    (full_state / SCHEDULER_FILE).write_text(json.dumps(state))


def read_scheduler_state(full_state: Path) -> dict[str, Any]:
    """The LR scheduler's state of a checkpoint (JSON; ``scheduler.pt`` of older ones)."""
    path = full_state / SCHEDULER_FILE
    if path.exists():
        state = json.loads(path.read_text())
    else:
        path = full_state / LEGACY_SCHEDULER_FILE
        state = load_data(path)
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a scheduler state (a {type(state).__name__})")
    return state


def read_rng_state(path: Path) -> dict[str, torch.Tensor]:
    """A rank's RNG state: ``{"cpu": ByteTensor, "cuda": ByteTensor (optional)}``."""
    st = load_data(path)
    tensors = isinstance(st, dict) and all(isinstance(v, torch.Tensor) for v in st.values())
    if not (tensors and "cpu" in st):
        raise CheckpointError(f"{path}: not an RNG state")
    return st


def _torch_value(name: str) -> Any:
    """``torch.<name>`` if it is one of torch's value types (Size, a dtype, a layout, a
    memory format), else None."""
    obj = getattr(torch, name, None)
    if obj is torch.Size or isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)):
        return obj
    return None


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's ``.metadata``: its own data classes and torch's value types, nothing
    that could run code (the standard "restricting globals" recipe)."""

    def find_class(self, module: str, name: str) -> Any:
        obj: Any = None
        if module == _DCP_PACKAGE or module.startswith(_DCP_PACKAGE + "."):
            # only modules already imported (no import runs on the file's say-so)
            cls = getattr(sys.modules.get(module), name, None)
            if isinstance(cls, type) and (is_dataclass(cls) or issubclass(cls, Enum)):
                obj = cls
        elif module == "torch":
            obj = _torch_value(name)
        elif module == "torch.serialization" and name == "_get_layout":
            obj = torch.serialization._get_layout  # a layout by name
        elif (module, name) in _PLAIN_CLASSES:
            obj = super().find_class(module, name)
        if obj is None:
            raise pickle.UnpicklingError(f"{module}.{name}")
        return obj


class SafeReader(FileSystemReader):
    """DCP's file reader with a ``.metadata`` that cannot run code. ``refused`` holds the
    error when it refused one (DCP wraps errors of its stages in its own exceptions)."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.refused: CheckpointError | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        get_path = getattr(self, "_get_metadata_path", None)  # torch >= 2.7
        path = Path(
            get_path(kwargs.get("rank"))
            if get_path
            else self.fs.concat_path(self.path, ".metadata")
        )
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except pickle.UnpicklingError as exc:
                self.refused = refusal(path, str(exc))
                raise self.refused from None
        if not isinstance(metadata, Metadata):
            self.refused = refusal(path, f"a {type(metadata).__name__}")
            raise self.refused
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's load planner, but the non-tensor values of the shards (the optimizer's
    hyperparameters) are read with ``weights_only=True``, not ``False``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.refused: CheckpointError | None = None

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            self.refused = refusal(self.path, f"{_what(exc)} (in {read_item.dest_index.fqn})")
            raise self.refused from None
        # Re-serialized by us from plain data: DCP's own weights_only=False load of it is safe.
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        super().load_bytes(read_item, buf)
