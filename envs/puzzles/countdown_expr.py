"""Countdown arithmetic: a safe evaluator, an instance generator and a solver.

The evaluator reads expressions over the integers with ``+ - * /`` and
parentheses through its own tokenizer and recursive-descent parser, computing
with exact :class:`fractions.Fraction` values; model text is never handed to
Python's ``eval``. Every literal must be one of the given numbers, each used at
most once, so the size of any value is bounded by the numbers themselves; the
text length and the parenthesis depth are bounded too, so no input can make it
slow or deep. There is no unary minus and no power.

Grammar (whitespace between tokens is ignored)::

    expr   := term (("+" | "-") term)*
    term   := factor (("*" | "/") factor)*
    factor := NUMBER | "(" expr ")"
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

#: Expressions longer than this are refused without being read.
MAX_EXPRESSION_LENGTH = 200
#: Parentheses may nest this deep at most.
MAX_DEPTH = 16
#: A literal with more digits than this is refused (no given number is that long).
MAX_LITERAL_DIGITS = 6
_DIGITS = "0123456789"
_SPACE = " \t\n"
#: Characters models tend to write instead of an operator, and what to say about them.
_HINTS = {
    "=": "write the expression alone, without '='",
    "x": "use * for multiplication",
    "X": "use * for multiplication",
    "\u00d7": "use * for multiplication",
    "\u00f7": "use / for division",
    "^": "powers are not allowed",
}


class ExpressionError(ValueError):
    """An expression that cannot be read or computed; the message says why."""


def _shown(ch: str) -> str:
    return repr(ch) if ch.isascii() and ch.isprintable() else f"U+{ord(ch):04X}"


def tokenize(text: str) -> list[str | int]:
    """The tokens of ``text``: ints for numbers (ASCII digits only), one-character
    strings for operators and parentheses. Raises :class:`ExpressionError`."""
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"the expression is longer than {MAX_EXPRESSION_LENGTH} characters")
    tokens: list[str | int] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _SPACE:
            i += 1
        elif ch in _DIGITS:
            j = i
            while j < n and text[j] in _DIGITS:
                j += 1
            if j - i > MAX_LITERAL_DIGITS:
                raise ExpressionError(f"the number at position {i + 1} is too long")
            tokens.append(int(text[i:j]))
            i = j
        elif ch in "+-*/()":
            if ch == "*" and text[i + 1 : i + 2] == "*":
                raise ExpressionError("powers are not allowed")
            tokens.append(ch)
            i += 1
        else:
            hint = _HINTS.get(ch, "use only numbers, + - * / and parentheses")
            raise ExpressionError(f"unexpected character {_shown(ch)} at position {i + 1}: {hint}")
    return tokens


class _Parser:
    """One pass of recursive descent over a token list, drawing the literals from
    the multiset of given numbers."""

    def __init__(self, tokens: list[str | int], numbers: Sequence[int]) -> None:
        self.tokens = tokens
        self.pos = 0
        self.depth = 0
        self.left = Counter(numbers)
        self.used: list[int] = []

    def peek(self) -> str | int | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def expr(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.term()
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self) -> Fraction:
        value = self.factor()
        while self.peek() in ("*", "/"):
            op = self.tokens[self.pos]
            self.pos += 1
            rhs = self.factor()
            if op == "*":
                value *= rhs
            elif rhs == 0:
                raise ExpressionError("division by zero")
            else:
                value /= rhs
        return value

    def factor(self) -> Fraction:
        tok = self.peek()
        if isinstance(tok, int):
            self.pos += 1
            if self.left[tok] <= 0:
                if tok in self.used:
                    raise ExpressionError(f"{tok} is used more times than it is given")
                raise ExpressionError(f"{tok} is not one of the numbers")
            self.left[tok] -= 1
            self.used.append(tok)
            return Fraction(tok)
        if tok == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise ExpressionError(f"parentheses nest deeper than {MAX_DEPTH}")
            self.pos += 1
            value = self.expr()
            if self.peek() != ")":
                raise ExpressionError("a '(' is not closed")
            self.pos += 1
            self.depth -= 1
            return value
        if tok == "-":
            raise ExpressionError("a minus sign must stand between two numbers (no negatives)")
        found = "the end" if tok is None else repr(tok)
        raise ExpressionError(f"expected a number or '(' but found {found}")


def evaluate(text: str, numbers: Sequence[int]) -> tuple[Fraction, list[int]]:
    """The exact value of the expression ``text`` and the numbers it used, in order.

    Raises :class:`ExpressionError` for anything else: bad characters or syntax,
    a literal that is not among ``numbers`` (or is used more times than given),
    division by zero, too long or too deeply nested input.
    """
    if not isinstance(text, str):
        raise ExpressionError(f"an expression is a str, got {type(text).__name__}")
    tokens = tokenize(text)
    if not tokens:
        raise ExpressionError("the expression is empty")
    parser = _Parser(tokens, numbers)
    value = parser.expr()
    if parser.pos != len(tokens):
        raise ExpressionError(
            f"unexpected {parser.tokens[parser.pos]!r} after a complete expression"
        )
    return value, parser.used


def format_value(value: Fraction) -> str:
    """``37``, ``-3`` or ``37/4``."""
    return str(value.numerator) if value.denominator == 1 else str(value)


def _combine(rng: np.random.Generator, a: int, b: int, max_target: int) -> tuple[int, str]:
    """A random operation on ``a >= b`` with a result in [1, max_target]: its value and
    operator. Subtraction or division always qualifies, so one is found."""
    for op in rng.permutation(["+", "-", "*", "/"]):
        if op == "+" and a + b <= max_target:
            return a + b, "+"
        if op == "-" and a > b:
            return a - b, "-"
        if op == "*" and a * b <= max_target:
            return a * b, "*"
        if op == "/" and a % b == 0:
            return a // b, "/"
    return a // b, "/"  # a == b: division gives 1


def generate(
    rng: np.random.Generator, num_numbers: int, max_number: int, max_target: int
) -> tuple[list[int], int, str]:
    """Draw ``num_numbers`` numbers in [1, max_number] and a target in [1, max_target]
    made from all of them: (numbers, target, an expression that reaches it).

    Pairs are combined at random until one value is left; every step keeps the
    value a positive integer no larger than ``max_target`` (which must be at least
    ``max_number``). A few redraws avoid a target equal to one of the numbers.
    """
    for _ in range(20):
        numbers = [int(x) for x in rng.integers(1, max_number + 1, size=num_numbers)]
        items = [(n, str(n)) for n in numbers]
        while len(items) > 1:
            i, j = (int(k) for k in rng.choice(len(items), size=2, replace=False))
            (a, ea), (b, eb) = sorted((items[i], items[j]), key=lambda item: -item[0])
            value, op = _combine(rng, a, b, max_target)
            items = [item for k, item in enumerate(items) if k not in (i, j)]
            items.append((value, f"({ea} {op} {eb})"))
        target, expression = items[0]
        if target not in numbers:
            break
    expression = expression[1:-1] if expression.startswith("(") else expression
    return numbers, target, expression


def random_expression(rng: np.random.Generator, numbers: Sequence[int]) -> str:
    """A random well-formed expression over a random non-empty subset of ``numbers``
    (the demo's random agent): random pairs joined by random operators."""
    size = int(rng.integers(1, len(numbers) + 1))
    items = [str(numbers[int(k)]) for k in rng.choice(len(numbers), size=size, replace=False)]
    while len(items) > 1:
        i, j = (int(k) for k in rng.choice(len(items), size=2, replace=False))
        op = "+-*/"[int(rng.integers(4))]
        joined = f"({items[i]} {op} {items[j]})"
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [joined]
    text = items[0]
    return text[1:-1] if text.startswith("(") else text


def solve(numbers: Sequence[int], target: int | Fraction) -> str | None:
    """An expression over ``numbers`` (each at most once) equal to ``target``, or None.

    Exhaustive search over the ways of combining two values of the pool into one,
    with exact fractions and a memo of pools already tried; instant for four
    numbers, seconds at most for six.
    """
    goal = Fraction(target)
    seen: set[tuple[Fraction, ...]] = set()

    def search(pool: list[tuple[Fraction, str]]) -> str | None:
        for value, text in pool:
            if value == goal:
                return text
        key = tuple(sorted(value for value, _ in pool))
        if len(pool) < 2 or key in seen:
            return None
        seen.add(key)
        for i in range(len(pool)):
            for j in range(i + 1, len(pool)):
                (a, ea), (b, eb) = pool[i], pool[j]
                rest = [item for k, item in enumerate(pool) if k not in (i, j)]
                options = [(a + b, f"({ea} + {eb})"), (a * b, f"({ea} * {eb})")]
                options += [(a - b, f"({ea} - {eb})"), (b - a, f"({eb} - {ea})")]
                if b:
                    options.append((a / b, f"({ea} / {eb})"))
                if a:
                    options.append((b / a, f"({eb} / {ea})"))
                for option in options:
                    found = search(rest + [option])
                    if found is not None:
                        return found
        return None

    found = search([(Fraction(n), str(n)) for n in numbers])
    if found is not None and found.startswith("(") and found.endswith(")"):
        # The outer pair always closes the top-level combination.
        found = found[1:-1]
    return found
