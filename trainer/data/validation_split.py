"""A validation set carved from the training data (``validation_split``), as InstructLab's
``validation_split`` does.

Which samples are held out depends only on the number of samples, the fraction and the
seed: never on the rank, the world size, the run's position or the process (a stdlib
``random.Random`` seeded with an int is the same everywhere). So every rank holds out the
same samples, and a resumed run validates on the same samples it never trained on.
"""

from __future__ import annotations

import hashlib
import math
import random
from typing import Any, TypeVar

from trainer.data.rows import DataError

T = TypeVar("T")


def held_out_count(n: int, fraction: float) -> int:
    """Samples held out of ``n``: the fraction rounded up (at least one when ``fraction`` > 0),
    like ``datasets``' ``train_test_split(test_size=fraction)``."""
    return math.ceil(n * fraction) if fraction > 0 else 0


def held_out(n: int, fraction: float, seed: int) -> list[int]:
    """The sorted indices of the held-out samples; a DataError if nothing would be left to
    train on."""
    k = held_out_count(n, fraction)
    if k >= n:
        raise DataError(
            f"validation_split {fraction} of {n} samples holds out {k}: none left to train on"
        )
    return sorted(random.Random(seed).sample(range(n), k))


def split(samples: list[T], fraction: float, seed: int) -> tuple[list[T], list[T]]:
    """``(train, validation)``: the held-out samples and the rest, each in file order."""
    val_idx = set(held_out(len(samples), fraction, seed))
    train = [s for i, s in enumerate(samples) if i not in val_idx]
    val = [s for i, s in enumerate(samples) if i in val_idx]
    return train, val


def describe(n: int, fraction: float, seed: int) -> dict[str, Any]:
    """What ``train_begin`` records of the split (``data.validation_split``): the fraction, the
    held-out count and a digest of the held-out indices, equal across ranks and resumes."""
    idx = held_out(n, fraction, seed)
    digest = hashlib.sha256(",".join(map(str, idx)).encode()).hexdigest()[:16]
    return {"fraction": fraction, "val_samples": len(idx), "held_out_digest": digest}
