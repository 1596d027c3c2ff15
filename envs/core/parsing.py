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
#: The default tags: (think open, think close, answer open, answer close).
DEFAULT_TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)


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
    think_tags, answer_tags: the (opening, closing) strings that stand for
        ``<think>``/``</think>`` and ``<answer>``/``</answer>`` (four distinct,
        non-blank strings, none inside another).
    """

    require_think: bool = True
    separator: str = "||"
    max_actions: int = 5
    think_tags: tuple[str, str] = (THINK_OPEN, THINK_CLOSE)
    answer_tags: tuple[str, str] = (ANSWER_OPEN, ANSWER_CLOSE)

    @property
    def tags(self) -> tuple[str, str, str, str]:
        return (*self.think_tags, *self.answer_tags)

    def wrap(self, body: str) -> str:
        """``body`` inside the answer tags, as an example answer reads."""
        return f"{self.answer_tags[0]}{body}{self.answer_tags[1]}"

    def __post_init__(self) -> None:
        for name in ("think_tags", "answer_tags"):
            pair = getattr(self, name)
            if (
                not isinstance(pair, list | tuple)
                or len(pair) != 2
                or not all(isinstance(t, str) and t.strip() for t in pair)
            ):
                raise ValueError(
                    f"{name} must be two non-blank strings (opening, closing), got {pair!r}"
                )
            object.__setattr__(self, name, tuple(pair))
        tags = self.tags
        if any(a in b for i, a in enumerate(tags) for j, b in enumerate(tags) if i != j):
            raise ValueError(f"the tags {tags} must be distinct, and none inside another")
        if not isinstance(self.separator, str) or not self.separator.strip():
            raise ValueError(f"separator must be a non-blank string, got {self.separator!r}")
        if any(self.separator in tag or tag in self.separator for tag in tags) or (
            "<" in self.separator
        ):
            raise ValueError(f"separator {self.separator!r} must not overlap the tags {tags}")
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


def read_answer_block(
    text: str, require_think: bool = True, tags: tuple[str, str, str, str] = DEFAULT_TAGS
) -> AnswerBlock:
    """Check the tag structure of ``text`` and cut out the think and answer bodies.

    Accepted shape, with only whitespace allowed outside the tags:
    ``<think>free text</think><answer>anything without tags</answer>``. Each tag
    must appear exactly once (the think tags at most once when ``require_think``
    is False), in that order, and neither body may contain a tag. ``tags`` are the
    four tag strings in that order (:attr:`ParserConfig.tags`). Linear in the
    length of ``text``; never raises.
    """
    if not isinstance(text, str):
        return AnswerBlock(False, error=f"answer must be a str, got {type(text).__name__}")
    think_open, think_close, answer_open, answer_close = tags
    if text.count(answer_open) != 1 or text.count(answer_close) != 1:
        return AnswerBlock(
            False, error=f"expected exactly one {answer_open}...{answer_close} block"
        )
    n_think = text.count(think_open)
    if n_think != text.count(think_close) or n_think > 1:
        return AnswerBlock(
            False, error=f"expected at most one matched {think_open}...{think_close} block"
        )
    if require_think and n_think == 0:
        return AnswerBlock(False, error=f"missing {think_open}...{think_close} block")

    a_open = text.find(answer_open)
    a_close = text.find(answer_close)
    if a_close < a_open:
        return AnswerBlock(False, error=f"{answer_close} comes before {answer_open}")
    think = ""
    head_end = a_open
    if n_think:
        t_open = text.find(think_open)
        t_close = text.find(think_close)
        if not (t_open < t_close < a_open):
            return AnswerBlock(
                False, error=f"{think_open}...{think_close} must come before {answer_open}"
            )
        if text[:t_open].strip() or text[t_close + len(think_close) : a_open].strip():
            return AnswerBlock(False, error="text outside the tags")
        think = text[t_open + len(think_open) : t_close]
        head_end = t_open
    if text[:head_end].strip() or text[a_close + len(answer_close) :].strip():
        return AnswerBlock(False, error="text outside the tags")
    return AnswerBlock(True, think=think, body=text[a_open + len(answer_open) : a_close])


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
    block = read_answer_block(text, config.require_think, config.tags)
    if not block.format_ok:
        return _fail(block.error)
    think = block.think
    tokens = tuple(tok.strip() for tok in block.body.split(config.separator))
    tokens = tuple(tok for tok in tokens if tok)
    if not tokens:
        return ParsedAnswer(format_ok=False, think=think, error=f"empty {config.answer_tags[0]}")

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
