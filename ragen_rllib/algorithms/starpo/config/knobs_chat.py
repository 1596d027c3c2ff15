"""The chat room's knobs (``chat/prompts.py``): the prompts' wording, a preset
(``prompt_style``) with any of its parts replaced (``prompt``), and the text every
answer starts with (``prefill``)."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import choice, custom
from ragen_rllib.chat.prompts import PROMPT_STYLES

K = Knob

PROMPT = knobs(
    "prompt",
    K(
        "prompt_style",
        "full",
        choice(PROMPT_STYLES),
        "full: system message, turn number, actions left and format reminder (real "
        "LLMs); compact: the observation alone (small models)",
        cross=True,
    ),
    K(
        "prompt",
        None,
        custom(
            lambda v: v is None or isinstance(v, dict),
            "must be null or a mapping of prompt parts, e.g. {system: 'You play a game.'}",
        ),
        "the wording part by part over the preset: system, turn, reward, budget, "
        "format_hint, separator, prefill (docs/training.md, Prompts)",
        cross=True,
    ),
    K(
        "prefill",
        "<think>",
        custom(lambda v: isinstance(v, str), "must be a string (may be empty)"),
        "text that starts every answer (not generated, no loss)",
        cross=True,
    ),
)

ALL = PROMPT
