"""Stop sequences: an answer ends at the token whose text completes one of them.

A stop sequence is text, and a text can end inside a token, so an engine that
samples token ids checks the decoded tail of each answer after every token
(:meth:`StopStrings.reached`) and ends the answer there. :meth:`StopStrings.cut`
then gives the exact place, for any engine: the fewest tokens whose text
contains a stop sequence. The ids kept are those sampled up to and including
that token (the model's own, with their log-probabilities: ending an answer by a
rule on what was sampled changes nothing about the tokens before), and the text
returned is the answer up to where the stop sequence starts.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

#: stop sequences per request at most, and characters per sequence
MAX_STOPS = 4
MAX_STOP_CHARS = 64


@dataclass(frozen=True)
class StopStrings:
    """The stop sequences of a request, and the tokenizer's ``decode`` that turns ids
    into the text they are matched against. Compared and hashed by ``texts`` only."""

    texts: tuple[str, ...]
    decode: Callable[[list[int]], str] = field(compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        if not self.texts or len(self.texts) > MAX_STOPS:
            raise ValueError(f"1 to {MAX_STOPS} stop sequences, got {len(self.texts)}")
        for text in self.texts:
            if not isinstance(text, str) or not 1 <= len(text) <= MAX_STOP_CHARS:
                raise ValueError(f"a stop sequence is 1 to {MAX_STOP_CHARS} characters: {text!r}")

    @property
    def window(self) -> int:
        """Tokens at the end of an answer that hold any stop sequence completed by
        its last token (a token is at least one character; a few more cover tokens
        that are a part of one character's bytes)."""
        return max(len(t) for t in self.texts) + 4

    def _found(self, text: str) -> int:
        """Where the earliest stop sequence in ``text`` starts (-1: none)."""
        starts = [i for i in (text.find(t) for t in self.texts) if i >= 0]
        return min(starts) if starts else -1

    def _holds(self, ids: list[int]) -> bool:
        return self._found(self.decode(ids)) >= 0

    def reached(self, ids: list[int]) -> bool:
        """Whether the answer ``ids`` (checked after each token) holds a stop sequence
        in its last :attr:`window` tokens."""
        return self._found(self.decode(ids[-self.window :])) >= 0

    def cut(self, ids: list[int]) -> tuple[int, str] | None:
        """(the fewest leading tokens of ``ids`` whose text holds a stop sequence, the
        text before that sequence), or None when the answer holds none."""
        text = self.decode(ids)
        if self._found(text) < 0:
            return None
        # Holding a stop sequence only grows with the prefix: the first such prefix.
        prefixes = range(1, len(ids) + 1)
        n = prefixes[bisect_left(prefixes, True, key=lambda k: self._holds(ids[:k]))]
        head = self.decode(ids[:n])
        return n, head[: self._found(head)]
