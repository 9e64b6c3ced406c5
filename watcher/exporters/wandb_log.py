"""Read back what a W&B run directory holds: the history rows of its ``run-<id>.wandb`` file.

The file is W&B's transaction log (what ``wandb sync`` uploads): a 7-byte header
(``:W&B``, magic ``0xBEE1``, version 0), then LevelDB log-format blocks of 32 KiB whose
records (7-byte header: CRC-32, length, type full/first/middle/last) carry serialized
``wandb_internal_pb2.Record`` messages. wandb ships no reader for it any more, so this is
one. A torn tail (the writer was killed mid-record) ends the read; it is not an error.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def _payloads(data: bytes) -> Iterator[bytes]:
    """The logical records of one transaction log, in order."""
    if not data.startswith(_HEADER):
        return
    pos, parts = len(_HEADER), bytearray()
    while pos + 7 <= len(data):
        left = _BLOCK - pos % _BLOCK
        if left < 7:  # a block's trailer is zero padding
            pos += left
            continue
        crc, length, kind = struct.unpack_from("<IHB", data, pos)
        body = data[pos + 7 : pos + 7 + length]
        if len(body) < length or zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            return  # torn or zeroed tail
        pos += 7 + length
        if kind == _FULL:
            yield bytes(body)
        elif kind == _FIRST:
            parts = bytearray(body)
        elif kind == _MIDDLE:
            parts += body
        elif kind == _LAST:
            parts += body
            yield bytes(parts)


def records(wandb_file: Path) -> list[Any]:
    """Every ``wandb_internal_pb2.Record`` of one run directory's ``.wandb`` file."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for raw in _payloads(wandb_file.read_bytes()):
        rec = pb.Record()  # type: ignore[attr-defined]
        rec.ParseFromString(raw)
        out.append(rec)
    return out


def _items(items: Any) -> dict[str, Any]:
    return {
        (i.key or "/".join(i.nested_key)): json.loads(i.value_json) if i.value_json else None
        for i in items
    }


def history_rows(wandb_file: Path) -> list[dict[str, Any]]:
    """Every history row logged to one run directory's ``.wandb`` file, as plain dicts
    (``_step``, ``_timestamp`` and the logged keys)."""
    return [
        _items(r.history.item)
        for r in records(wandb_file)
        if r.WhichOneof("record_type") == "history"
    ]


def summary(wandb_file: Path) -> dict[str, Any]:
    """The run summary as the file's summary updates leave it."""
    out: dict[str, Any] = {}
    for r in records(wandb_file):
        if r.WhichOneof("record_type") == "summary":
            out.update(_items(r.summary.update))
    return out


def project(wandb_file: Path) -> str | None:
    """The W&B project a run directory's ``.wandb`` file was written for (its ``run``
    record's), or None when it names none."""
    for r in records(wandb_file):
        if r.WhichOneof("record_type") == "run":
            return r.run.project or None
    return None


def run_files(root: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of every directory wandb made for ``run_id`` under ``root``
    (``root/wandb/[offline-]run-<time>-<id>/run-<id>.wandb``), oldest first."""
    found = [*root.glob(f"wandb/run-*-{run_id}"), *root.glob(f"wandb/offline-run-*-{run_id}")]
    dirs = sorted(found, key=lambda d: d.name.removeprefix("offline-"))
    return [f for d in dirs if (f := d / f"run-{run_id}.wandb").is_file()]
