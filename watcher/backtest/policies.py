"""What a backtest replays: built-in stopping policies with the options ``ilab-watch``
takes (``--early-stopping``, ``--divergence``), the eval's own target (``--target``),
retention with ``ilab-train``'s (``--keep-last-n``, ``--keep-best``), and sweeps: a value
given as a range ``1..8`` or a list ``[1,2,4]`` makes one variant per value."""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

from journal.record.numbers import parse_number, shown_value
from watcher.builtin.steering import parse_builtin
from watcher.hooks.callbacks import CallbackSpecError

#: Sweeps larger than this are refused: a typo such as 1..100000 should not run for hours.
MAX_VARIANTS = 256
#: ``A..B`` of anything number-like (``1.5..3`` too: refused as a range, not a TypeError).
_RANGE = re.compile(r"^([-+]?[\d.eE_+]+?)\.\.([-+]?[\d.eE_+]+)$")
_TARGET = re.compile(r"^\s*([A-Za-z_][\w.\-/]*)\s*(>=|<=|>|<)\s*(\S+)\s*$")


def expand_values(raw: str, where: str) -> list[str]:
    """``"1..4"`` -> 1, 2, 3, 4; ``"[0,0.01]"`` -> 0, 0.01; anything else: itself. Each
    value is then judged like a single one (the setting's own rule); a range's ends must
    be whole numbers."""
    raw = raw.strip()
    if m := _RANGE.match(raw):
        try:
            lo, hi = (parse_number(end, whole=True) for end in (m[1], m[2]))
        except ValueError:
            raise CallbackSpecError(
                f"{where}: range {shown_value(raw)}: expected whole numbers A..B, e.g. 1..8"
            ) from None
        if hi < lo:
            raise CallbackSpecError(f"{where}: range {raw} ends before it starts")
        if hi - lo + 1 > MAX_VARIANTS:
            raise CallbackSpecError(f"{where}: range {raw} has over {MAX_VARIANTS} values")
        return [str(v) for v in range(lo, hi + 1)]
    if raw.startswith("[") and raw.endswith("]"):
        values = [v.strip() for v in raw[1:-1].split(",") if v.strip()]
        if not values:
            raise CallbackSpecError(f"{where}: an empty list {raw}")
        return values
    return [raw]


def _split_pairs(spec: str) -> list[str]:
    """``a=1,b=[1,2]`` split at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in spec:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return [p.strip() for p in parts if p.strip()]


def expand_spec(spec: str, where: str) -> list[tuple[str, str]]:
    """A built-in's spec with ranges and lists -> ``(label, plain spec)`` per combination;
    the label names the swept values (``patience=3``), or is the whole spec."""
    keys, choices = [], []
    for part in _split_pairs(spec):
        key, sep, raw = part.partition("=")
        if not sep:
            raise CallbackSpecError(f"{where} {spec!r}: expected key=value pairs, got {part!r}")
        keys.append(key.strip())
        choices.append(expand_values(raw, f"{where} {key.strip()}"))
    combos = list(itertools.product(*choices)) if keys else [()]
    if len(combos) > MAX_VARIANTS:
        raise CallbackSpecError(f"{where}: {len(combos)} combinations, at most {MAX_VARIANTS}")
    swept = [i for i, c in enumerate(choices) if len(c) > 1]
    out = []
    for combo in combos:
        plain = ",".join(f"{k}={v}" for k, v in zip(keys, combo, strict=True))
        label = ",".join(f"{keys[i]}={combo[i]}" for i in swept) or plain or "defaults"
        out.append((label, plain))
    return out


@dataclass(frozen=True)
class Target:
    """``accuracy>=0.8``: the eval's own stop, decided when its result is known."""

    metric: str
    op: str
    value: float

    @classmethod
    def parse(cls, text: str) -> Target:
        m = _TARGET.match(text)
        try:
            value = parse_number(m[3] if m else "")  # any finite number: a metric's bound
        except ValueError:
            raise CallbackSpecError(
                f"--target {shown_value(text)!r}: expected METRIC>=NUMBER (or <=, >, <), "
                "e.g. accuracy>=0.8"
            ) from None
        assert m is not None
        return cls(m[1], m[2], value)

    def met(self, v: float) -> bool:
        return {
            ">=": v >= self.value,
            "<=": v <= self.value,
            ">": v > self.value,
            "<": v < self.value,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.value:g}"


@dataclass
class StopPolicy:
    """One stopping variant: built-in callbacks made fresh per journal, the user's
    callbacks (``objects``/``functions``: made once, as a watcher makes them), or a target."""

    label: str
    kind: str  # early_stopping | divergence | eval | callback
    builtin: tuple[str, str] | None = None  # (parse_builtin kind, plain spec)
    target: Target | None = None

    def make(self) -> Any:
        """A fresh built-in callback (its state is per run)."""
        assert self.builtin is not None
        return parse_builtin(*self.builtin)


def stop_policies(
    early_stopping: tuple[str, ...], divergence: tuple[str, ...], targets: tuple[str, ...]
) -> list[StopPolicy]:
    """Every built-in stopping variant asked for (each made once to check its settings)."""
    out = []
    for kind, word, specs in (
        ("early-stopping", "early_stopping", early_stopping),
        ("divergence", "divergence", divergence),
    ):
        for spec in specs:
            for label, plain in expand_spec(spec, f"--{kind}"):
                policy = StopPolicy(f"{word} {label}", word, builtin=(kind, plain))
                policy.make()  # a bad setting: one line now, not per journal
                out.append(policy)
    for text in targets:
        t = Target.parse(text)
        out.append(StopPolicy(f"target {t}", "eval", target=t))
    return out


def keep_last_values(raw: str | None) -> list[int | None]:
    """``--keep-last-n 2`` / ``1..4`` / ``[1,3]`` -> the values (None: the run's own)."""
    if raw is None:
        return [None]
    out: list[int | None] = []
    for v in expand_values(raw, "--keep-last-n"):
        try:
            out.append(parse_number(v, whole=True, low=1))
        except ValueError as exc:
            raise CallbackSpecError(f"--keep-last-n {shown_value(v)}: {exc}") from None
    return out
