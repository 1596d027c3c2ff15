"""The warmup room's knobs (``warmup/format_warmup.py``): the format warm-up, a few
supervised steps on well-formed answers with random actions that make a run's starting
weights: how many, on how many prompts each, at which learning rate, and what the
answers' think text says."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import choice, integer, number

WARMUP_THINK = ("filler", "state")
K = Knob

WARMUP = knobs(
    "format warm-up",
    K(
        "format_warmup_steps",
        0,
        integer(0, 100_000, why=" (0: no warm-up)"),
        "supervised steps on well-formed answers with random actions before training (0: none)",
        cross=True,
    ),
    K("format_warmup_batch", 8, integer(1, 1024), "first prompts per warm-up step"),
    K(
        "format_warmup_think",
        "filler",
        choice(WARMUP_THINK),
        "the warm-up answers' think text: filler (a few filler words) or state (true "
        "sentences the env reads off the state: where the goal lies, what is next to "
        "the player; the env's state_notes(), grid envs); the actions stay random",
        cross=True,
    ),
    K(
        "format_warmup_lr",
        5e-5,
        number(0, 1, low_open=True, high_open=True),
        "the warm-up's learning rate",
    ),
)

ALL = WARMUP
