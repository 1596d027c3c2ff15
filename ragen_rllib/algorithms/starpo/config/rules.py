"""What one config value may be: a rule is a test, the sentence an error gives, and the
shape of what it allows (kind, bounds, choices), which the knob table and the config
fuzzer read.

Booleans are not numbers here (YAML's ``true`` is not 1), numbers are finite, and
integers stay below 2**31 (a larger value is a typo, not a setting).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

INT_LIMIT = 2**31


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:  # an int too large for a float
        return False


@dataclass(frozen=True)
class Rule:
    """A value's test and the sentence that says what it allows.

    ``kind`` is ``int``, ``number``, ``bool``, ``choice`` or ``other`` (a test of its
    own); the bounds (``low``/``high``, open or closed), ``choices`` and ``none_ok``
    describe the allowed values of the first four kinds to readers other than the
    test: the docs' knob table and the fuzzer's mutations.
    """

    test: Callable[[Any], bool]
    #: the sentence, or a function that writes it when asked (a registry's choices)
    sentence: str | Callable[[], str]
    kind: str = "other"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    none_ok: bool = False
    #: the allowed values of a choice, or a function that lists them when asked
    options: tuple | Callable[[], tuple] = ()

    @property
    def allowed(self) -> str:
        return self.sentence() if callable(self.sentence) else self.sentence

    @property
    def choices(self) -> tuple:
        return tuple(self.options()) if callable(self.options) else tuple(self.options)

    def ok(self, value: Any) -> bool:
        return (self.none_ok and value is None) or self.test(value)


def _prefix(none_ok: bool, null: str) -> str:
    if not none_ok:
        return "must be "
    return f"must be null{f' ({null})' if null else ''} or "


def integer(low: int, high: int | None = None, *, none_ok=False, null="", why="") -> Rule:
    """An integer in [low, high], or >= low (and < 2**31) when high is None; ``why`` is
    appended to the sentence as given."""
    top = INT_LIMIT - 1 if high is None else high
    span = f">= {low} (and < 2**31)" if high is None else f"in [{low}, {high}]"
    return Rule(
        lambda v: is_int(v) and low <= v <= top,
        _prefix(none_ok, null) + f"an integer {span}" + why,
        "int",
        low,
        top,
        none_ok=none_ok,
    )


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    none_ok: bool = False,
    null: str = "",
    why: str = "",
) -> Rule:
    """A finite number within the bounds given (open or closed)."""

    def test(v: Any) -> bool:
        if not is_number(v):
            return False
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or (v < high if high_open else v <= high)

    if low is not None and high is not None:
        span = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
        span = f"{'>' if low_open else '>='} {low:g}"
    else:
        span = f"{'<' if high_open else '<='} {high:g}" if high is not None else ""
    text = _prefix(none_ok, null) + "a finite number" + (f" {span}" if span else "")
    return Rule(test, text + why, "number", low, high, low_open, high_open, none_ok)


def boolean() -> Rule:
    return Rule(lambda v: isinstance(v, bool), "must be true or false", "bool")


def choice(values, *, none_ok: bool = False, null: str = "") -> Rule:
    values = tuple(values)
    head = f"allowed values are null ({null}) or " if none_ok else "allowed values are "
    return Rule(
        lambda v: isinstance(v, str) and v in values,
        head + str(list(values)),
        "choice",
        none_ok=none_ok,
        options=values,
    )


def registry_choice(registry: Mapping[str, Any]) -> Rule:
    """One of a registry's names (policy losses, KL and advantage estimators), read
    when a value is checked, so that a row registered after the knob was declared is
    allowed and named in the error."""
    return Rule(
        lambda v: isinstance(v, str) and v in registry,
        lambda: "allowed values are " + str(list(registry)),
        "choice",
        options=lambda: tuple(registry),
    )


def custom(test: Callable[[Any], bool], allowed: str) -> Rule:
    """A rule of its own shape; ``allowed`` says it in full."""
    return Rule(test, allowed)


def checked_elsewhere(allowed: str) -> Rule:
    """A value whose check needs the env, the model or the mixture (config/env_checks,
    config/checks): every value passes here, and ``allowed`` documents it."""
    return Rule(lambda v: True, allowed)


def number_hint(value: Any) -> str:
    """A hint for numbers that YAML read as strings (`1e-4` without a '.' is a string)."""
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return (
            f" (got the string {value!r}: YAML reads exponents without a decimal point, "
            "such as 1e-4, as strings; write 1.0e-4)"
        )
    return ""
