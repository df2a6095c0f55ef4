"""A safe parser, canonical form and brute-force solver for + - * expressions over integers.

Completions are untrusted model output, so they are never ``eval``-ed: a
small recursive-descent parser accepts only integers, ``+ - *``, parentheses
and spaces, within a length and nesting bound. Anything else (names,
attributes, ``/``, ``**``, calls) is a :class:`ExpressionError`, which the
countdown reward turns into 0.

The canonical form flattens ``+``/``-`` chains into signed terms and ``*``
chains into factors and sorts both, so ``3+5``, ``5+3`` and ``9-(1-5)+... ``
rewrites that only reorder commutative operands count as one answer, while
truly different expressions stay different. It is itself a valid expression
with the same value.

Grammar::

    expr   := term (("+" | "-") term)*
    term   := factor ("*" factor)*
    factor := NUMBER | "(" expr ")"
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_CHARS = 64
MAX_DEPTH = 8
MAX_LITERAL_DIGITS = 4
_ALLOWED = set("0123456789+-*() ")


class ExpressionError(ValueError):
    """Not an expression of the allowed grammar; the message says where."""


@dataclass(frozen=True)
class Num:
    value: int


@dataclass(frozen=True)
class Sum:
    terms: tuple[tuple[int, Node], ...]  # (sign +1/-1, node); never a Sum inside, at least one +1


@dataclass(frozen=True)
class Prod:
    factors: tuple[Node, ...]  # never a Prod inside, at least two


Node = Num | Sum | Prod


def _tokens(text: str) -> list[str]:
    if len(text) > MAX_CHARS:
        raise ExpressionError(f"expression longer than {MAX_CHARS} characters")
    bad = sorted(set(text) - _ALLOWED)
    if bad:
        raise ExpressionError(f"character {bad[0]!r} is not allowed (only digits, + - * ( ) and spaces)")
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == " ":
            i += 1
        elif ch.isdigit():
            j = i
            while j < len(text) and text[j].isdigit():
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                raise ExpressionError(f"number {text[i:j]!r} has more than {MAX_LITERAL_DIGITS} digits")
            out.append(text[i:j])
            i = j
        else:
            out.append(ch)
            i += 1
    return out


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.pos = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise ExpressionError("expression ends too early")
        self.pos += 1
        return tok

    def expr(self, depth: int) -> Node:
        terms: list[tuple[int, Node]] = []
        sign = 1
        while True:
            node = self.term(depth)
            if isinstance(node, Sum):  # a parenthesised sum: its terms join this one
                terms.extend((sign * s, t) for s, t in node.terms)
            else:
                terms.append((sign, node))
            op = self.peek()
            if op not in ("+", "-"):
                break
            self.take()
            sign = 1 if op == "+" else -1
        return terms[0][1] if len(terms) == 1 else Sum(tuple(terms))

    def term(self, depth: int) -> Node:
        factors: list[Node] = []
        while True:
            node = self.factor(depth)
            factors.extend(node.factors if isinstance(node, Prod) else [node])
            if self.peek() != "*":
                break
            self.take()
        return factors[0] if len(factors) == 1 else Prod(tuple(factors))

    def factor(self, depth: int) -> Node:
        tok = self.take()
        if tok.isdigit():
            return Num(int(tok))
        if tok == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"parentheses nested deeper than {MAX_DEPTH}")
            node = self.expr(depth + 1)
            if self.take() != ")":
                raise ExpressionError("missing ')'")
            return node
        raise ExpressionError(f"unexpected {tok!r} at token {self.pos}")


def parse(text: str) -> Node:
    """The expression tree of ``text``; :class:`ExpressionError` for anything outside the grammar."""
    parser = _Parser(_tokens(text))
    if parser.peek() is None:
        raise ExpressionError("empty expression")
    node = parser.expr(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after the expression")
    return node


def value(node: Node) -> int:
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Sum):
        return sum(s * value(t) for s, t in node.terms)
    out = 1
    for f in node.factors:
        out *= value(f)
    return out


def numbers(node: Node) -> Counter[int]:
    """The multiset of literals the expression uses."""
    if isinstance(node, Num):
        return Counter([node.value])
    children = [t for _, t in node.terms] if isinstance(node, Sum) else list(node.factors)
    out: Counter[int] = Counter()
    for c in children:
        out += numbers(c)
    return out


def canonical(node: Node) -> str:
    """Equal for expressions that differ only by the order of commutative operands."""
    if isinstance(node, Num):
        return str(node.value)
    if isinstance(node, Prod):
        parts = [f"({canonical(f)})" if isinstance(f, Sum) else canonical(f) for f in node.factors]
        return "*".join(sorted(parts))
    plus = sorted(canonical(t) for s, t in node.terms if s > 0)
    minus = sorted(canonical(t) for s, t in node.terms if s < 0)
    return "+".join(plus) + "".join("-" + m for m in minus)


# --- exhaustive search over the given numbers (prompt generation and SFT targets) ---
#
# Dynamic programming over subsets of the given numbers: the expressions of a
# subset are the combinations of the expressions of its two-part splits, kept
# once per canonical form, so reorderings are never explored twice.

Found = dict[str, tuple[int, Node]]  # canonical form -> (value, tree)


def _terms(node: Node) -> tuple[tuple[int, Node], ...]:
    return node.terms if isinstance(node, Sum) else ((1, node),)


def _factors(node: Node) -> tuple[Node, ...]:
    return node.factors if isinstance(node, Prod) else (node,)


def _combine(a: tuple[int, Node], b: tuple[int, Node]) -> list[tuple[int, Node]]:
    """a+b, a*b and the non-negative one of a-b / b-a (trees flattened as the parser does)."""
    (va, na), (vb, nb) = a, b
    out: list[tuple[int, Node]] = [
        (va + vb, Sum(_terms(na) + _terms(nb))),
        (va * vb, Prod(_factors(na) + _factors(nb))),
    ]
    if va >= vb:
        out.append((va - vb, Sum(_terms(na) + tuple((-s, t) for s, t in _terms(nb)))))
    if vb > va:
        out.append((vb - va, Sum(_terms(nb) + tuple((-s, t) for s, t in _terms(na)))))
    return out


def _all_expressions(given: Sequence[int]) -> dict[int, Found]:
    """Bit mask of a subset of ``given`` -> its distinct expressions (each number used at most once)."""
    n = len(given)
    table: dict[int, Found] = {1 << i: {str(v): (v, Num(v))} for i, v in enumerate(given)}
    for mask in sorted(range(1, 1 << n), key=lambda m: bin(m).count("1")):
        if mask in table:
            continue
        found: Found = {}
        sub = (mask - 1) & mask
        while sub:
            rest = mask ^ sub
            if sub < rest:  # each unordered split once
                for a in table[sub].values():
                    for b in table[rest].values():
                        for item in _combine(a, b):
                            found.setdefault(canonical(item[1]), item)
            sub = (sub - 1) & mask
        table[mask] = found
    return table


def reachable(given: Sequence[int]) -> set[int]:
    """Non-negative values of expressions over two or more of ``given`` (each used at most once)."""
    table = _all_expressions(given)
    return {v for mask, found in table.items() if bin(mask).count("1") >= 2 for v, _ in found.values()}


def solve_all(given: Sequence[int], low: int, high: int) -> dict[int, dict[str, str]]:
    """Every target in [low, high] reachable from ``given`` -> its distinct correct expressions
    (canonical form -> text; the canonical form is itself a valid expression)."""
    out: dict[int, dict[str, str]] = {}
    for found in _all_expressions(given).values():
        for key, (v, _) in found.items():
            if low <= v <= high:
                out.setdefault(v, {})[key] = key
    return out


def solutions(given: Sequence[int], target: int) -> dict[str, str]:
    """Distinct correct expressions (canonical form -> text) reaching ``target`` from ``given``."""
    return solve_all(given, target, target).get(target, {})
