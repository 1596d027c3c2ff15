"""The rl_module room's knobs (``rl_module/``): how the actor and the critic run a
micro-batch's forward and backward passes: rows laid end to end, each shared prefix
encoded once, activations recomputed to save memory."""

from __future__ import annotations

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import boolean

K = Knob

PASSES = knobs(
    "packing and activation memory",
    K(
        "gradient_checkpointing",
        False,
        boolean(),
        "recompute activations in the backward pass (less memory, ~1/3 more compute)",
    ),
    K(
        "pack_sequences",
        True,
        boolean(),
        "lay a micro-batch's rows end to end in one sequence (no compute on padding)",
    ),
    K(
        "share_prefixes",
        True,
        boolean(),
        "with pack_sequences: encode each token prefix a pass's rows share once (system "
        "message, a group's first prompt, earlier turns); max_tokens_per_microbatch then "
        "counts the tokens encoded",
    ),
)

ALL = PASSES
