"""Parse a model's answer into actions.

Sits between the language model and the environments: every env's ``step()``
hands the raw answer text to :func:`parse_answer`, which decides whether the
answer respects the ``<think>...</think><answer>...</answer>`` structure and
which of the actions named inside ``<answer>`` are valid. Envs whose answer is
free text rather than action names (:mod:`.answer_env`) use the tag check alone,
:func:`read_answer_block`.

The parser only scans for fixed tag strings (``str.find``/``str.count``), so its
cost is linear in the text length and no input, however long or adversarial,
can make it backtrack or raise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


@dataclass(frozen=True)
class ParsedAnswer:
    """What :func:`parse_answer` found in one model answer.

    ``format_ok`` is True when the tag structure is right and ``<answer>`` holds
    at least one action token. ``actions`` are the valid actions in canonical
    spelling, in order, already cut to ``max_actions``; ``invalid`` are the
    raw tokens that name no known action (they are dropped, not executed).
    ``num_dropped`` counts valid actions cut by ``max_actions``.
    """

    format_ok: bool
    think: str = ""
    actions: tuple[str, ...] = ()
    invalid: tuple[str, ...] = ()
    num_dropped: int = 0
    error: str = ""
    raw_tokens: tuple[str, ...] = field(default=(), repr=False)

    @property
    def is_valid(self) -> bool:
        """True when the format penalty does not apply to this answer."""
        return self.format_ok and not self.invalid


@dataclass(frozen=True)
class ParserConfig:
    """How answers are read.

    require_think: the ``<think>...</think>`` block must come before
        ``<answer>``. When False the block is optional (still at most one).
    separator: the string between two actions inside ``<answer>``.
    max_actions: actions executed per turn at most; further valid actions are
        dropped without penalty and counted in ``ParsedAnswer.num_dropped``.
    """

    require_think: bool = True
    separator: str = "||"
    max_actions: int = 5

    def __post_init__(self) -> None:
        if not isinstance(self.separator, str) or not self.separator.strip():
            raise ValueError(f"separator must be a non-blank string, got {self.separator!r}")
        if any(self.separator in tag for tag in _TAGS) or "<" in self.separator:
            raise ValueError(f"separator {self.separator!r} must not overlap the tags {_TAGS}")
        if not isinstance(self.max_actions, int) or self.max_actions < 1:
            raise ValueError(f"max_actions must be an int >= 1, got {self.max_actions!r}")


def _fail(error: str) -> ParsedAnswer:
    return ParsedAnswer(format_ok=False, error=error)


@dataclass(frozen=True)
class AnswerBlock:
    """The ``<think>``/``<answer>`` structure of one model answer, before any reading
    of what the answer says.

    ``format_ok`` is True when the tags are right (see :func:`read_answer_block`);
    then ``body`` is the raw text between ``<answer>`` and ``</answer>`` (not
    stripped, possibly blank) and ``think`` the think block's text; otherwise
    ``error`` says what is wrong and both are empty.
    """

    format_ok: bool
    think: str = ""
    body: str = ""
    error: str = ""


def read_answer_block(text: str, require_think: bool = True) -> AnswerBlock:
    """Check the tag structure of ``text`` and cut out the think and answer bodies.

    Accepted shape, with only whitespace allowed outside the tags:
    ``<think>free text</think><answer>anything without tags</answer>``. Each tag
    must appear exactly once (the think tags at most once when ``require_think``
    is False), in that order, and neither body may contain a tag. Linear in the
    length of ``text``; never raises.
    """
    if not isinstance(text, str):
        return AnswerBlock(False, error=f"answer must be a str, got {type(text).__name__}")
    counts = {tag: text.count(tag) for tag in _TAGS}
    if counts[ANSWER_OPEN] != 1 or counts[ANSWER_CLOSE] != 1:
        return AnswerBlock(False, error="expected exactly one <answer>...</answer> block")
    n_think = counts[THINK_OPEN]
    if n_think != counts[THINK_CLOSE] or n_think > 1:
        return AnswerBlock(False, error="expected at most one matched <think>...</think> block")
    if require_think and n_think == 0:
        return AnswerBlock(False, error="missing <think>...</think> block")

    a_open = text.find(ANSWER_OPEN)
    a_close = text.find(ANSWER_CLOSE)
    if a_close < a_open:
        return AnswerBlock(False, error="</answer> comes before <answer>")
    think = ""
    head_end = a_open
    if n_think:
        t_open = text.find(THINK_OPEN)
        t_close = text.find(THINK_CLOSE)
        if not (t_open < t_close < a_open):
            return AnswerBlock(False, error="<think>...</think> must come before <answer>")
        if text[:t_open].strip() or text[t_close + len(THINK_CLOSE) : a_open].strip():
            return AnswerBlock(False, error="text outside the tags")
        think = text[t_open + len(THINK_OPEN) : t_close]
        head_end = t_open
    if text[:head_end].strip() or text[a_close + len(ANSWER_CLOSE) :].strip():
        return AnswerBlock(False, error="text outside the tags")
    return AnswerBlock(True, think=think, body=text[a_open + len(ANSWER_OPEN) : a_close])


def parse_answer(
    text: str,
    action_names: tuple[str, ...] | list[str],
    config: ParserConfig = ParserConfig(),
) -> ParsedAnswer:
    """Parse ``text`` against the known ``action_names`` (matched case-insensitively).

    Accepted shape: that of :func:`read_answer_block`, the answer body holding
    action names separated by ``config.separator``:
    ``<think>free text</think><answer>A1 || A2 || ...</answer>``.
    Anything else is a format failure with no actions.
    """
    block = read_answer_block(text, config.require_think)
    if not block.format_ok:
        return _fail(block.error)
    think = block.think
    tokens = tuple(tok.strip() for tok in block.body.split(config.separator))
    tokens = tuple(tok for tok in tokens if tok)
    if not tokens:
        return ParsedAnswer(format_ok=False, think=think, error="empty <answer>")

    lookup = {name.lower(): name for name in action_names}
    valid: list[str] = []
    invalid: list[str] = []
    for tok in tokens:
        name = lookup.get(tok.lower())
        (valid if name is not None else invalid).append(name if name is not None else tok)
    kept = valid[: config.max_actions]
    return ParsedAnswer(
        format_ok=True,
        think=think,
        actions=tuple(kept),
        invalid=tuple(invalid),
        num_dropped=len(valid) - len(kept),
        raw_tokens=tokens,
    )
