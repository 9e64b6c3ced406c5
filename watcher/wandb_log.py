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


def history_rows(wandb_file: Path) -> list[dict[str, Any]]:
    """Every history row logged to one run directory's ``.wandb`` file, as plain dicts
    (``_step``, ``_timestamp`` and the logged keys)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rows = []
    for raw in _payloads(wandb_file.read_bytes()):
        rec = pb.Record()  # type: ignore[attr-defined]
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") != "history":
            continue
        row = {}
        for item in rec.history.item:
            key = item.key or "/".join(item.nested_key)
            row[key] = json.loads(item.value_json) if item.value_json else None
        rows.append(row)
    return rows


def run_files(root: Path, run_id: str) -> list[Path]:
    """The ``.wandb`` files of every directory wandb made for ``run_id`` under ``root``
    (``root/wandb/[offline-]run-<time>-<id>/run-<id>.wandb``), oldest first."""
    found = [*root.glob(f"wandb/run-*-{run_id}"), *root.glob(f"wandb/offline-run-*-{run_id}")]
    dirs = sorted(found, key=lambda d: d.name.removeprefix("offline-"))
    return [f for d in dirs if (f := d / f"run-{run_id}.wandb").is_file()]
