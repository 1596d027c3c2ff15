"""Reading a final answer out of free text, and comparing answers.

Used by the question-answering envs (:mod:`.dataset_qa`, :mod:`.search_qa`) and
by the dataset loader, which reads the gold answers of a file with the same rules.

:func:`extract_final_answer` finds the final answer in a reply, trying in order:

1. the last ``\\boxed{...}`` (or ``\\fbox{...}``) whose braces close, nested braces
   included (``\\boxed{\\frac{3}{4}}`` gives ``\\frac{3}{4}``);
2. the text after the last ``####`` (GSM8K's final line), up to the end of its line;
3. the text after the last "the answer is" (any case, an optional colon), up to
   the end of its line;
4. otherwise the whole reply.

:func:`answers_match` then compares it with the gold answer:

* when the gold answer reads as a number (:func:`parse_number`), the reply must read
  as the same exact rational number: ``1,234`` = ``1234``, ``$42`` = ``42``, ``42.0``
  = ``42``, ``3/4`` = ``0.75`` = ``\\frac{3}{4}``, ``-5`` = ``\u22125``, ``50%`` = ``50``
  (a percent sign is dropped, not divided by 100: GSM8K writes 50% as 50), ``12 apples``
  = ``12`` (up to three words after the number are read as a unit). No tolerance:
  ``0.33`` is not ``1/3``. Digits of any script count (``\u0664\u0662`` is 42);
  a comma is a thousands separator only in groups of three (``1,5`` is not a number);
* otherwise the strings must be equal once whitespace runs are collapsed and a
  trailing period and surrounding ``$`` are dropped (case matters).

:func:`normalize_text` is the looser comparison of short factual answers (lower
case, no punctuation, no articles, single spaces), used by :mod:`.search_qa`.

Every function here runs in time linear in its input: fixed-string scans
(``str.rfind``), one pass over the braces, and anchored regular expressions without
nested quantifiers applied only to texts cut to :data:`MAX_NUMBER_TEXT` characters.
"""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

#: A candidate longer than this (after the final answer is cut out) is not a number.
MAX_NUMBER_TEXT = 120
_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_ANSWER_IS = re.compile(r"the\s{1,3}(?:final\s{1,3})?answer\s{1,3}is\b", re.IGNORECASE)
_DECIMAL = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)", re.ASCII)
_RATIO = re.compile(r"([+-]?\d+)\s?/\s?(\d+)", re.ASCII)
_LATEX_FRAC = re.compile(r"([+-]?)\\[dt]?frac\{\s?([+-]?\d+)\s?\}\{\s?(\d+)\s?\}", re.ASCII)
_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?", re.ASCII)
_UNIT = re.compile(r"(.*?\d\.?)\s?(?:[A-Za-z]+\.?)(?: [A-Za-z]+\.?){0,2}", re.ASCII)
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})
_ARTICLES = frozenset({"a", "an", "the"})


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` / ``\\fbox{...}`` in ``text`` whose
    braces close, or None. Only the last opener is examined (one linear pass)."""
    start, opener = max((text.rfind(o), o) for o in _BOX_OPENERS)
    if start < 0:
        return None
    depth = 1
    begin = start + len(opener)
    for i in range(begin, len(text)):
        ch = text[i]
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
    return None


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start : len(text) if end < 0 else end]


def extract_final_answer(text: str) -> str:
    """The final answer written in ``text`` (see the module docstring for the order of
    the rules), stripped; ``""`` when the rule that applies finds nothing."""
    boxed = last_boxed(text)
    if boxed is not None:
        return clean_answer(boxed)
    hashes = text.rfind("####")
    if hashes >= 0:
        return clean_answer(_rest_of_line(text, hashes + 4))
    last = None
    for last in _ANSWER_IS.finditer(text):  # noqa: B007 - the last match is wanted
        pass
    if last is not None:
        return clean_answer(_rest_of_line(text, last.end()).lstrip(" :"))
    return clean_answer(text)


def clean_answer(text: str) -> str:
    """``text`` stripped of surrounding whitespace, ``$...$`` and a final period."""
    text = text.strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$" and text.count("$") == 2:
        text = text[1:-1].strip()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1].rstrip()
    return text


def _ascii_digits(text: str) -> str:
    """``text`` with every decimal digit of any script written as an ASCII digit."""
    text = text.translate(_MINUS_SIGNS)
    return "".join(str(unicodedata.decimal(ch)) if ch.isdecimal() else ch for ch in text)


def parse_number(text: str) -> Fraction | None:
    """``text`` read as an exact rational number, or None when it is not one number.

    >>> parse_number("$1,234.50"), parse_number("\\\\frac{3}{4}"), parse_number("50%")
    (Fraction(2469, 2), Fraction(3, 4), Fraction(50, 1))
    >>> parse_number("1,5") is None, parse_number("12 apples")
    (True, Fraction(12, 1))
    """
    text = clean_answer(text)
    if not text or len(text) > MAX_NUMBER_TEXT:
        return None
    text = _ascii_digits(text).replace("\\!", "").replace("\\,", "").strip()
    for prefix in ("\\$", "$"):
        if text.startswith(prefix) or text.startswith("-" + prefix):
            sign = "-" if text[0] == "-" else ""
            text = sign + text[len(sign) + len(prefix) :].lstrip()
    for suffix in ("\\%", "%"):
        if text.endswith(suffix):
            text = text[: -len(suffix)].rstrip()
    unit = _UNIT.fullmatch(text)
    if unit:  # "12 apples", "3.5 km": the number before at most three words
        text = unit.group(1).rstrip()
    if text.endswith("."):
        text = text[:-1]
    if _GROUPED.fullmatch(text):
        text = text.replace(",", "")
    if _DECIMAL.fullmatch(text):
        return Fraction(text.rstrip(".") if text[-1] == "." else text)
    ratio = _RATIO.fullmatch(text)
    if ratio:
        num, den = int(ratio.group(1)), int(ratio.group(2))
        return Fraction(num, den) if den else None
    frac = _LATEX_FRAC.fullmatch(text)
    if frac:
        sign, num, den = frac.group(1), int(frac.group(2)), int(frac.group(3))
        if not den:
            return None
        return -Fraction(num, den) if sign == "-" else Fraction(num, den)
    return None


def _plain(text: str) -> str:
    return " ".join(clean_answer(text).split())


def answers_match(candidate: str, gold: str) -> bool:
    """Whether the extracted answer ``candidate`` is the gold answer: the same number
    when the gold answer is a number, else the same string up to whitespace."""
    gold_value = parse_number(gold)
    if gold_value is not None:
        return parse_number(candidate) == gold_value
    return _plain(candidate) == _plain(gold)


def normalize_text(text: str) -> str:
    """A short answer for a loose comparison: lower case, punctuation removed, the
    articles a/an/the dropped, whitespace collapsed.

    >>> normalize_text("  The Republic of  Velmora! ")
    'republic of velmora'
    """
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(ch)[0] in "PS" else ch for ch in text)
    return " ".join(word for word in text.split() if word not in _ARTICLES)
