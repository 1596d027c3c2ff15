"""TrajectoryMinibatches: a learner's minibatches, whole trajectories each.

The algorithm decides how many minibatches an epoch has (the same count on
every learner, so that they step together); each learner then splits its own
shard of trajectories into that many with
:func:`~ragen_rllib.maths.batching.minibatch_plan`. A trajectory may span several
rows of the batch (one per turn under a context window): its rows always travel
together, found through the ``row_trajectory`` column. Unlike RLlib's cyclic
iterator, a shard that the minibatch size does not divide is split into
minibatches of sizes as equal as possible: no trajectory is used twice in an
epoch, none is skipped.
"""

from __future__ import annotations

import numpy as np
import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from ragen_rllib.maths.batching import minibatch_plan


class TrajectoryMinibatches:
    """``num_epochs`` passes over a batch of trajectories, ``num_minibatches`` each.

    ``shuffle`` permutes each epoch's trajectories with a generator seeded by
    ``seed`` (reproducible from the checkpointed policy version)."""

    def __init__(
        self,
        batch: MultiAgentBatch,
        *,
        num_minibatches: int,
        num_epochs: int,
        shuffle: bool,
        seed: int,
    ):
        self.batch = batch
        self.num_epochs = num_epochs
        # module id -> per row, its minibatch in each epoch  # [R, epochs]
        self.row_plans: dict[str, np.ndarray] = {}
        for mid, module_batch in batch.policy_batches.items():
            owner = module_batch["row_trajectory"]  # on the learner's device by now
            owner = owner.cpu().numpy() if torch.is_tensor(owner) else np.asarray(owner)
            _, trajectory = np.unique(owner, return_inverse=True)
            count = int(trajectory.max()) + 1 if len(owner) else 0
            plan = minibatch_plan(count, num_minibatches, num_epochs, shuffle, seed)
            self.row_plans[mid] = plan[trajectory]

    def __iter__(self):
        for epoch in range(self.num_epochs):
            steps = max(
                (int(p[:, epoch].max()) + 1 for p in self.row_plans.values() if len(p)), default=0
            )
            for j in range(steps):
                parts = {}
                for mid, module_batch in self.batch.policy_batches.items():
                    rows = np.flatnonzero(self.row_plans[mid][:, epoch] == j)
                    if len(rows):
                        index = torch.as_tensor(rows)
                        parts[mid] = SampleBatch({k: v[index] for k, v in module_batch.items()})
                if parts:
                    yield MultiAgentBatch(parts, env_steps=max(len(p) for p in parts.values()))
