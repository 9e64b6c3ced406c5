"""``ilab-journal check --expect EXPR``: a small expression language over a run's facts,
tokenized and parsed here (never ``eval``), checked for types before anything is read.

Grammar (docs/cli.md, "check")::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | compare
    compare := value [OP value | ["not"] "in" "(" value ("," value)* ")"]
    value   := NUMBER | STRING | WORD | WORD "(" METRIC ")" | "(" expr ")"
    OP      := "==" | "!=" | "<" | "<=" | ">" | ">="

A WORD is a fact (:data:`FACTS`), ``true``/``false``/``none``, or a bare string, but only
where a string is expected: on the right of a comparison with a string fact (``status ==
completed``) or inside ``in (...)`` (``status in (completed, stopped)``). Anywhere else an
unknown word is refused naming the closest fact (``stauts == completed``: did you mean
``status``), so a typo can never be read as a string and pass. ``NAME(METRIC)`` reads a
metric's values (:data:`FUNCTIONS`); METRIC may be ``name:max`` or ``name:min`` for
``best``. Which metrics a run has is known only once it is read: ``journal.cli.check``
refuses a metric a settled run never had (:func:`journal.ask.names.unknown_metric`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# FACTS and FUNCTIONS live in names.py with the typo hints; imported here, where they
# have always been read from (the help and docs tests among others)
from journal.ask.names import FACTS, FUNCTIONS, VOCABULARY, did_you_mean
from journal.record.numbers import parse_number, shown_value

_LITERALS: dict[str, Any] = {"true": True, "false": False, "none": None}
#: Parentheses and ``not`` nested deeper than this are refused: the parser recurses once per
#: level, and a test nobody writes by hand must not end in a RecursionError.
MAX_NESTING = 32
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_TOKEN = re.compile(
    r"\s*(?:(?P<num>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<str>\"[^\"]*\"|'[^']*')"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_.\-/]*(?::(?:max|min))?)"
    r"|(?P<op>==|!=|<=|>=|<|>|\(|\)|,))"
)


class ExpectError(ValueError):
    """An expression that cannot be parsed or whose types do not fit: one line."""


@dataclass(frozen=True)
class Metric:
    """``best(accuracy)``: a function of one metric."""

    fn: str
    metric: str

    def __str__(self) -> str:
        return f"{self.fn}({self.metric})"


@dataclass(frozen=True)
class Ref:
    """A fact of the run, or a metric function: its value comes from the run."""

    name: str  # a fact's name, or str(Metric)
    metric: Metric | None = None


@dataclass(frozen=True)
class Lit:
    value: Any


@dataclass(frozen=True)
class Word(Lit):
    """A bare word that is no fact nor literal: a string only where one is expected (the
    right of a comparison with a string fact, inside ``in (...)``), else an unknown name.
    Never left in a parsed tree: :meth:`_Parser.compare` turns it into a :class:`Lit` or
    refuses it."""


@dataclass(frozen=True)
class Compare:
    left: Ref | Lit
    op: str  # one of _OPS, "in" or "not in"
    right: tuple[Ref | Lit, ...]


@dataclass(frozen=True)
class Logic:
    op: str  # "and", "or", "not"
    args: tuple[Node, ...]


Node = Compare | Logic | Ref | Lit


@dataclass
class Expectation:
    """One parsed ``--expect``: its text, its tree, the facts and metrics it reads."""

    text: str
    tree: Node
    refs: list[Ref] = field(default_factory=list)

    @property
    def metrics(self) -> set[str]:
        return {r.metric.metric.partition(":")[0] for r in self.refs if r.metric}

    def holds(self, facts: Mapping[str, Any]) -> bool:
        """Whether it holds, with each Ref's value from ``facts`` (by its name)."""
        return bool(_truth(self.tree, facts))

    def values(self, facts: Mapping[str, Any]) -> dict[str, Any]:
        """The actual value of each fact and metric it reads, by name (printed on failure)."""
        return {r.name: facts.get(r.name) for r in self.refs}


def parse(text: str) -> Expectation:
    """Parse one expression; raises :class:`ExpectError` naming what is wrong."""
    tokens = _tokenize(text)
    p = _Parser(text, tokens)
    tree = p.expr()
    if p.pos != len(tokens):
        raise ExpectError(f"{text!r}: unexpected {tokens[p.pos][1]!r}")
    if not isinstance(tree, (Compare, Logic)) and not _is_bool(tree):
        raise ExpectError(f"{text!r}: not a test (compare with ==, <, >=, in (...))")
    refs: list[Ref] = []
    _collect(tree, refs)
    return Expectation(text, tree, list(dict.fromkeys(refs)))


def _tokenize(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while text[pos:].strip():  # blanks left: the end
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            bad = text[pos:].lstrip()[:20]
            raise ExpectError(f"{text!r}: cannot read {bad!r}")
        kind = m.lastgroup or "op"
        out.append((kind, m.group(kind)))
        pos = m.end()
    if not out:
        raise ExpectError("an empty expression")
    return out


class _Parser:
    """Recursive descent over the tokens (the grammar in the module doc)."""

    def __init__(self, text: str, tokens: list[tuple[str, str]]) -> None:
        self.text, self.tokens, self.pos = text, tokens, 0
        self.depth = 0  # parentheses and nots open around the current position

    def deeper(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise ExpectError(
                f"{shown_value(self.text)!r}: nested deeper than {MAX_NESTING} levels"
            )

    def peek(self, value: str | None = None) -> bool:
        if self.pos >= len(self.tokens):
            return False
        kind, tok = self.tokens[self.pos]
        return value is None or (tok == value and kind in ("op", "word"))

    def take(self, value: str) -> None:
        if not self.peek(value):
            got = self.tokens[self.pos][1] if self.pos < len(self.tokens) else "the end"
            raise ExpectError(f"{self.text!r}: expected {value!r}, got {got!r}")
        self.pos += 1

    def expr(self) -> Node:
        return self.chain("or", self.conj)

    def conj(self) -> Node:
        return self.chain("and", self.neg)

    def chain(self, op: str, operand: Callable[[], Node]) -> Node:
        """``operand (op operand)*``: one operand as itself, more joined by ``op``."""
        args = [operand()]
        while self.peek(op):
            self.pos += 1
            args.append(operand())
        return args[0] if len(args) == 1 else Logic(op, tuple(args))

    def neg(self) -> Node:
        if self.peek("not"):
            self.pos += 1
            self.deeper()
            node = Logic("not", (self.neg(),))
            self.depth -= 1
            return node
        return self.compare()

    def compare(self) -> Node:
        left = self.value()
        if self.peek() and self.tokens[self.pos][1] in _OPS and self.tokens[self.pos][0] == "op":
            op = self.tokens[self.pos][1]
            self.pos += 1
            lhs = self.operand(left)
            # a bare word on the right is a string only beside a string fact (status ==
            # completed); beside a number it can only be a misspelt fact (steps >= stpes)
            rhs = self.operand(self.value(), string_ok=_is_str_fact(lhs))
            return _typed(self.text, Compare(lhs, op, (rhs,)))
        negated = False
        if (
            self.peek("not")
            and self.pos + 1 < len(self.tokens)
            and self.tokens[self.pos + 1][1] == "in"
        ):
            negated, self.pos = True, self.pos + 1
        if self.peek("in"):
            self.pos += 1
            lhs = self.operand(left)
            words = _kind(lhs) != "num"  # (completed, stopped); steps in (1, stpes): a typo
            self.take("(")
            items = [self.operand(self.value(), string_ok=words)]
            while self.peek(","):
                self.pos += 1
                items.append(self.operand(self.value(), string_ok=words))
            self.take(")")
            op = "not in" if negated else "in"
            return _typed(self.text, Compare(lhs, op, tuple(items)))
        if isinstance(left, Word):  # a lone word: no string is expected here (stauts)
            self.operand(left)
        return left

    def operand(self, node: Node, *, string_ok: bool = False) -> Ref | Lit:
        """``node`` as one side of a comparison; a bare word as a string where ``string_ok``,
        else refused as an unknown fact, naming the closest one."""
        if isinstance(node, Word):
            if string_ok:
                return Lit(node.value)
            word = node.value
            hint = did_you_mean(word, [*FACTS, *_LITERALS])
            if not hint:
                hint = f" (facts: {', '.join(FACTS)}; a string elsewhere needs quotes)"
            raise ExpectError(f"{shown_value(self.text)!r}: unknown fact {word!r}{hint}")
        return _operand(self.text, node)

    def value(self) -> Node:
        if self.pos >= len(self.tokens):
            raise ExpectError(f"{self.text!r}: ends where a value was expected")
        kind, tok = self.tokens[self.pos]
        self.pos += 1
        if kind == "num":
            try:  # finite, and short: not 5000 digits (int() refuses past 4300) nor 1e309
                whole = not any(c in tok for c in ".eE")
                return Lit(parse_number(tok, whole=whole))
            except ValueError:
                raise ExpectError(
                    f"{shown_value(self.text)!r}: {shown_value(tok)} is not a number "
                    "that can be compared (too long or too large)"
                ) from None
        if kind == "str":
            return Lit(tok[1:-1])
        if kind == "op":
            if tok != "(":
                raise ExpectError(f"{self.text!r}: unexpected {tok!r}")
            self.deeper()
            inner = self.expr()
            self.take(")")
            self.depth -= 1
            return inner
        if self.peek("("):  # a metric function
            if tok not in FUNCTIONS:
                hint = did_you_mean(tok, FUNCTIONS)
                raise ExpectError(
                    f"{self.text!r}: unknown function {tok!r}{hint} (known: {', '.join(FUNCTIONS)})"
                )
            self.pos += 1
            if self.pos >= len(self.tokens) or self.tokens[self.pos][0] != "word":
                raise ExpectError(
                    f"{self.text!r}: {tok}( takes a metric name, e.g. {tok}(accuracy)"
                )
            metric = self.tokens[self.pos][1]
            if metric.endswith((":max", ":min")) and tok != "best":
                raise ExpectError(f"{self.text!r}: only best() takes :max or :min")
            self.pos += 1
            self.take(")")
            m = Metric(tok, metric)
            return Ref(str(m), m)
        if tok in FACTS:
            return Ref(tok)
        if tok in _LITERALS:
            return Lit(_LITERALS[tok])
        return Word(tok)  # a string or a misspelt fact: compare() tells which


def _operand(text: str, node: Node) -> Ref | Lit:
    if isinstance(node, (Ref, Lit)):
        return node
    raise ExpectError(f"{text!r}: a test cannot be compared; use and/or/not to combine tests")


def _is_str_fact(node: Ref | Lit) -> bool:
    return isinstance(node, Ref) and node.metric is None and FACTS[node.name][0] == "str"


def _kind(node: Ref | Lit) -> str | None:
    """ "num", "str", "bool" or None (none: fits any)."""
    if isinstance(node, Ref):
        return "num" if node.metric else FACTS[node.name][0]
    v = node.value
    if v is None:
        return None
    if isinstance(v, bool):
        return "bool"
    return "num" if isinstance(v, (int, float)) else "str"


def _typed(text: str, c: Compare) -> Compare:
    """Refuse what can never be true: a number against a word (``status == 3``,
    ``steps == "ten"``; a misspelt fact is refused before, as unknown), an order between
    words."""
    kinds = {_kind(n) for n in (c.left, *c.right)} - {None}
    if len(kinds) > 1:
        raise ExpectError(f"{text!r}: compares a number with a word")
    if isinstance(c.left, Ref) and c.left.name in VOCABULARY:
        words = VOCABULARY[c.left.name]
        for n in c.right:
            if isinstance(n, Lit) and isinstance(n.value, str) and n.value not in words:
                hint = did_you_mean(n.value, words) or f" (it is one of: {', '.join(words)})"
                raise ExpectError(f"{text!r}: {c.left.name} is never {n.value!r}{hint}")
    if c.op in ("<", "<=", ">", ">=") and kinds - {"num"}:
        raise ExpectError(f"{text!r}: {c.op} compares numbers only")
    return c


def _is_bool(node: Node) -> bool:
    return isinstance(node, Lit) and isinstance(node.value, bool)


def _collect(node: Node, out: list[Ref]) -> None:
    if isinstance(node, Ref):
        out.append(node)
    elif isinstance(node, Compare):
        for n in (node.left, *node.right):
            _collect(n, out)
    elif isinstance(node, Logic):
        for arg in node.args:
            _collect(arg, out)


def _value(node: Ref | Lit, facts: Mapping[str, Any]) -> Any:
    return facts.get(node.name) if isinstance(node, Ref) else node.value


def _truth(node: Node, facts: Mapping[str, Any]) -> Any:
    if isinstance(node, Logic):
        if node.op == "not":
            return not _truth(node.args[0], facts)
        results = (_truth(a, facts) for a in node.args)
        return all(results) if node.op == "and" else any(results)
    if isinstance(node, Compare):
        left = _value(node.left, facts)
        rights = [_value(r, facts) for r in node.right]
        if node.op in ("in", "not in"):
            return any(_equal(left, r) for r in rights) == (node.op == "in")
        right = rights[0]
        if node.op in ("==", "!="):
            return _equal(left, right) == (node.op == "==")
        if not _number(left) or not _number(right):  # a missing value never passes a bound
            return False
        return _OPS[node.op](left, right)
    return _value(node, facts)


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _equal(a: Any, b: Any) -> bool:
    if _number(a) and _number(b):
        return bool(a == b)
    return type(a) is type(b) and bool(a == b)
