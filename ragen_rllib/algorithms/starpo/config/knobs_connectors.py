"""The connectors room's knobs (``connectors/sample_batch.py``): what the driver's
sample-batch stage does to a rollout batch before the filter and the advantages: it
drops the groups an env error spoiled (and stops the run past a share of them), and
masks or penalises the answers that run into ``max_new_tokens``."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import choice, integer, number

NONNEG = number(0)
K = Knob

SAMPLE_BATCH = knobs(
    "env errors and overlong answers",
    K(
        "max_env_error_share",
        0.5,
        number(0, 1),
        "a batch with more env errors than this share stops the run; below it the "
        "failed groups are dropped and counted",
    ),
    K(
        "overlong",
        "none",
        choice(("none", "mask", "penalty")),
        "answers near max_new_tokens: none; mask (answers cut there leave the loss); "
        "penalty (DAPO's soft linear penalty over the last overlong_buffer tokens)",
        cross=True,
    ),
    K(
        "overlong_buffer",
        16,
        integer(1),
        "overlong penalty: tokens before max_new_tokens over which it grows",
        cross=True,
    ),
    K("overlong_penalty", 1.0, NONNEG, "overlong penalty: its size at max_new_tokens"),
)

ALL = SAMPLE_BATCH
