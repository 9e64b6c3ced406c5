"""Data: JSONL loading with clear errors, the demo task, and the deterministic step plan.

Every rank computes the same plan for a step from (seed, epoch, step): which samples form the
global batch, how they split across ranks and into token-budget micro-batches. So every rank
knows the global loss-token count (for exact loss normalisation) and the micro-batch count of
the busiest rank (so all ranks run the same number of forward/backward passes, as FSDP needs)
without any extra collective.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import torch

from journal.rundir.files import atomic_write
from trainer.data.pack import Pack
from trainer.data.rows import (
    EOS_ID,
    IGNORE_INDEX,
    DataError,
    encode,
    json_object,
    numbered_lines,
    token_row,
)

#: Input id on padding: valid in every vocabulary. Padding follows the tokens of a causal
#: model and its labels are -100, so its value never changes a loss.
PAD_INPUT = 0


@dataclass
class Sample:
    input_ids: list[int]
    labels: list[int]

    @property
    def loss_tokens(self) -> int:
        # Next-token prediction: label at position i is predicted from position i - 1.
        return sum(1 for x in self.labels[1:] if x != IGNORE_INDEX)


def load_jsonl(path: Path, max_seq_len: int, vocab_size: int | None = None) -> list[Sample]:
    """Read ``{"input_ids": [...], "labels": [...]}`` or ``{"text": ...}`` lines.

    Sequences longer than ``max_seq_len`` are truncated. Raises :class:`DataError` naming
    ``path:line`` for anything malformed (the checks: :func:`trainer.data.rows.token_row`).
    """
    samples: list[Sample] = []
    for n, raw in numbered_lines(path):
        where = f"{path}:{n}"
        ids, labels = token_row(json_object(raw, where), where, vocab_size)
        samples.append(Sample(ids[:max_seq_len], labels[:max_seq_len]))
    if not samples:
        raise DataError(f"{path}: no samples")
    return samples


# -- the demo task -------------------------------------------------------------------------


def demo_problem(a: int, b: int) -> tuple[str, str]:
    return f"{a}+{b}=", f"{a + b}"


def _jsonl(rows: Iterable[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in rows)


def _demo_sample(a: int, b: int) -> dict[str, list[int]]:
    prompt, answer = demo_problem(a, b)
    p, ans = encode(prompt), [*encode(answer), EOS_ID]
    return {"input_ids": p + ans, "labels": [IGNORE_INDEX] * len(p) + ans}


def make_demo_data(
    out_dir: Path, n_train: int = 6000, seed: int = 0, max_operand: int = 49
) -> dict[str, Path]:
    """Write the arithmetic demo: ``train.jsonl``, ``val.jsonl`` and ``heldout.jsonl``.

    Problems ``a+b=`` with ``0 <= a, b <= max_operand``. A tenth of the pairs is held out:
    they never appear in training, so eval accuracy measures generalisation.
    """
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    rng.shuffle(pairs)
    n_held = max(len(pairs) // 10, 20)
    held, train_pairs = pairs[:n_held], pairs[n_held:]
    val_pairs, eval_pairs = held[: n_held // 2], held[n_held // 2 :]
    contents = {
        "train": _jsonl(_demo_sample(*rng.choice(train_pairs)) for _ in range(n_train)),
        "val": _jsonl(_demo_sample(a, b) for a, b in val_pairs),
        "heldout": _jsonl(
            {"prompt": demo_problem(a, b)[0], "answer": demo_problem(a, b)[1]}
            for a, b in eval_pairs
        ),
    }
    files = {key: out_dir / f"{key}.jsonl" for key in contents}
    for key, path in files.items():  # readers never see a partial file; out_dir is no link
        atomic_write(path, contents[key], root=out_dir.parent, durable=False)
    return files


# -- the deterministic step plan -----------------------------------------------------------


@dataclass
class StepPlan:
    """What one rank does in one optimizer step."""

    micro_batches: list[list[int]]  # sample indices per micro-batch; [] = padding pass
    global_loss_tokens: int
    global_samples: int
    global_length: int


@dataclass
class Batch:
    """One micro-batch on the device, ready for the model's forward.

    ``targets[i]`` is the label of the token after position ``i`` within the same sample
    (-100 where there is no loss: prompts, the last token of each sample, padding), so the
    loss is a plain per-position cross-entropy and no label crosses a sample boundary in a
    packed row. ``position_ids`` and ``pack`` are set for packed rows only."""

    input_ids: torch.Tensor  # (rows, T)
    targets: torch.Tensor  # (rows, T)
    loss_tokens: int  # positions with a target, known on the host
    position_ids: torch.Tensor | None = None
    pack: Pack | None = None

    def model_kwargs(self) -> dict[str, Any]:
        """The forward's keyword arguments (the model returns the summed loss)."""
        kw: dict[str, Any] = {"input_ids": self.input_ids, "targets": self.targets}
        if self.pack is not None:
            kw["position_ids"] = self.position_ids
            kw.update(self.pack.model_kwargs())
        return kw


class StepPlanner:
    """Seeded, distributed, token-budget batching with gradient accumulation.

    Each epoch is a fixed permutation of the dataset (seed + epoch). A step takes the next
    ``batch_size`` samples (the last partial batch is dropped), splits them across ranks
    balancing tokens, and packs each rank's share into micro-batches within the
    ``max_batch_len`` token budget. Ranks with fewer micro-batches get padding passes.

    Padded (``pack_kernel`` None): a micro-batch is a rectangle of rows padded to its
    longest sample, and the budget counts padded tokens. Packed (``pack_kernel`` names the
    attention kernel, see :mod:`trainer.model.attention`): a micro-batch is one row of whole
    samples back to back, no padding, and the budget counts real tokens.
    """

    def __init__(
        self,
        samples: list[Sample],
        batch_size: int,
        max_batch_len: int,
        world_size: int,
        rank: int,
        seed: int,
        pack_kernel: str | None = None,
    ) -> None:
        if batch_size > len(samples):
            raise DataError(
                f"effective_batch_size {batch_size} exceeds the {len(samples)} training samples"
            )
        if batch_size < world_size:
            raise DataError(
                f"effective_batch_size {batch_size} is smaller than world size {world_size}"
            )
        longest = max(len(s.input_ids) for s in samples)
        if longest > max_batch_len:
            raise DataError(
                f"max_batch_len {max_batch_len} is shorter than the longest sample ({longest} tokens)"
            )
        self.samples = samples
        self.lengths = [len(s.input_ids) for s in samples]
        self.loss_tokens = [s.loss_tokens for s in samples]
        self.batch_size, self.max_batch_len = batch_size, max_batch_len
        self.world_size, self.rank, self.seed = world_size, rank, seed
        self.pack_kernel = pack_kernel
        self.steps_per_epoch = len(samples) // batch_size
        self._perm_epoch: int | None = None
        self._perm: list[int] = []

    def _epoch_perm(self, epoch: int) -> list[int]:
        if self._perm_epoch != epoch:
            g = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._perm = torch.randperm(len(self.samples), generator=g).tolist()
            self._perm_epoch = epoch
        return self._perm

    def plan(self, epoch: int, step_in_epoch: int) -> StepPlan:
        perm = self._epoch_perm(epoch)
        return self.plan_indices(
            perm[step_in_epoch * self.batch_size : (step_in_epoch + 1) * self.batch_size]
        )

    def plan_indices(self, batch: list[int]) -> StepPlan:
        """Split ``batch`` over ranks and pack this rank's share into micro-batches."""
        # Longest first onto the least-loaded rank: balanced tokens, deterministic everywhere.
        shares: list[list[int]] = [[] for _ in range(self.world_size)]
        load = [0] * self.world_size
        for idx in sorted(batch, key=lambda i: (-self.lengths[i], i)):
            r = min(range(self.world_size), key=lambda k: (load[k], len(shares[k]), k))
            shares[r].append(idx)
            load[r] += self.lengths[idx]
        pack = self._pack_tokens if self.pack_kernel else self._pack_padded
        packed = [pack(share) for share in shares]
        n_micro = max(len(p) for p in packed)
        mine = packed[self.rank] + [[] for _ in range(n_micro - len(packed[self.rank]))]
        return StepPlan(
            micro_batches=mine,
            global_loss_tokens=sum(self.loss_tokens[i] for i in batch),
            global_samples=len(batch),
            global_length=sum(self.lengths[i] for i in batch),
        )

    def _pack_padded(self, share: list[int]) -> list[list[int]]:
        """Greedy packing of length-sorted samples under the padded-token budget."""
        out: list[list[int]] = []
        cur: list[int] = []
        cur_max = 0
        for idx in sorted(share, key=lambda i: (self.lengths[i], i)):
            new_max = max(cur_max, self.lengths[idx])
            if cur and new_max * (len(cur) + 1) > self.max_batch_len:
                out.append(cur)
                cur, new_max = [], self.lengths[idx]
            cur.append(idx)
            cur_max = new_max
        if cur:
            out.append(cur)
        return out

    def _pack_tokens(self, share: list[int]) -> list[list[int]]:
        """First-fit decreasing under the real-token budget: few, full micro-batches."""
        bins: list[list[int]] = []
        room: list[int] = []
        for idx in sorted(share, key=lambda i: (-self.lengths[i], i)):
            n = self.lengths[idx]
            k = next((b for b, free in enumerate(room) if free >= n), len(bins))
            if k == len(bins):
                bins.append([])
                room.append(self.max_batch_len)
            bins[k].append(idx)
            room[k] -= n
        return bins

    def collate(self, indices: list[int], device: torch.device) -> Batch:
        """The micro-batch ``indices`` on ``device``: one packed row, or rows right-padded
        to the longest (-100 targets on padding). An empty list is a padding pass: two
        tokens, no loss (so every rank runs the same number of passes)."""
        rows = [self.samples[i] for i in indices] or [_PADDING_PASS]
        loss_tokens = sum(self.loss_tokens[i] for i in indices)  # a sample's targets' count
        if self.pack_kernel:
            ids = [t for s in rows for t in s.input_ids]
            targets = [t for s in rows for t in _targets(s.labels)]
            lengths = [len(s.input_ids) for s in rows]
            positions = [p for n in lengths for p in range(n)]
            ids_t, targets_t, pos_t = _to_device([[ids], [targets], [positions]], device)
            pack = Pack.build(lengths, self.pack_kernel, device)
            return Batch(ids_t, targets_t, loss_tokens, pos_t, pack)
        width = max(len(s.input_ids) for s in rows)
        rows_ids = [_padded(s.input_ids, width, PAD_INPUT) for s in rows]
        rows_targets = [_padded(_targets(s.labels), width, IGNORE_INDEX) for s in rows]
        ids_t, targets_t = _to_device([rows_ids, rows_targets], device)
        return Batch(ids_t, targets_t, loss_tokens)


_PADDING_PASS = Sample([PAD_INPUT, PAD_INPUT], [IGNORE_INDEX, IGNORE_INDEX])


def _targets(labels: list[int]) -> list[int]:
    """Next-token targets of one sample: its labels shifted left, nothing after its end."""
    return [*labels[1:], IGNORE_INDEX]


def _padded(row: list[int], width: int, fill: int) -> list[int]:
    return row + [fill] * (width - len(row))


def _to_device(planes: list[list[list[int]]], device: torch.device) -> list[torch.Tensor]:
    """Same-shaped int planes as one host tensor, copied once. Pinned host memory and a
    non-blocking copy on CUDA: the copy overlaps and the host does not wait for the GPU at
    every micro-batch."""
    pinned = device.type == "cuda"
    batch = torch.tensor(planes, dtype=torch.long)
    if pinned:
        batch = batch.pin_memory()
    return list(batch.to(device, non_blocking=pinned).unbind(0))
