"""Seeds: how every random stream of a run is derived from the config's ``seed``.

One rule, :func:`mix_seed`, combines a run's seed with a counter (an update, a
runner, a sample call), so that each stream is distinct and reproducible from
the checkpointed counters. The training seed stream draws the initial states of
every iteration; evaluation states lie below :data:`TRAIN_SEED_OFFSET` and are
never drawn for training.
"""

from __future__ import annotations

import numpy as np

#: Training seeds are drawn at or above this bound; evaluation seeds lie below it.
TRAIN_SEED_OFFSET = 1 << 20

_MIX = 1_000_003  # a prime: (seed, counter) pairs map to distinct integers in practice


def mix_seed(seed: int | None, counter: int | None = 0) -> int:
    """One integer seed from a run's ``seed`` (None: 0) and a ``counter``."""
    return int(seed or 0) * _MIX + int(counter or 0)


def training_group_seeds(base_seed: int, call: int, num_groups: int) -> tuple[list[int], int]:
    """The ``call``-th draw of a seed stream: ``num_groups`` initial-state seeds (all
    >= TRAIN_SEED_OFFSET, so never an evaluation state) and one sampling seed."""
    rng = np.random.default_rng([int(base_seed), int(call)])
    seeds = rng.integers(TRAIN_SEED_OFFSET, 2**31 - 1, size=num_groups)
    return [int(s) for s in seeds], int(rng.integers(2**31))
