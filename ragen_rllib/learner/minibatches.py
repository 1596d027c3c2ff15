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

from typing import Any

import numpy as np
import torch
from ray.rllib.core import ALL_MODULES
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.metrics import NUM_MODULE_STEPS_TRAINED, NUM_MODULE_STEPS_TRAINED_LIFETIME

from ragen_rllib.distributed.host_memory import trim_host_heap
from ragen_rllib.maths.batching import minibatch_plan, num_minibatches
from ragen_rllib.records.metrics import LEARNERS, run_log


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


class TrajectoryMinibatchesMixin:
    """A learner's update in :class:`TrajectoryMinibatches`: a mixin for
    :class:`~ragen_rllib.learner.starpo_learner.StarPOTorchLearner`, which provides
    ``optimizer_step`` (one optimizer step on one minibatch)."""

    def update(
        self,
        *args,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        minibatches_per_epoch: int | None = None,
        plan_seed: int = 0,
        **kwargs,
    ):
        """RLlib's ``update``, with StarPO's minibatches: RLlib hands the whole batch
        to :meth:`_update` once, which takes ``num_epochs`` passes over it in
        ``minibatches_per_epoch`` minibatches of whole trajectories (as the algorithm
        decides for all learners; default: from ``minibatch_size`` and this learner's
        trajectories), shuffled by ``plan_seed``; each minibatch is one optimizer step."""
        self._plan = {
            "num_epochs": num_epochs,
            "minibatch_size": minibatch_size,
            "shuffle": shuffle_batch_per_epoch,
            "num_minibatches": minibatches_per_epoch,
            "seed": plan_seed,
        }
        results = super().update(*args, num_epochs=1, minibatch_size=None, **kwargs)
        trim_host_heap()  # the minibatches' activations, freed (distributed/host_memory.py)
        return results

    def _update(self, batch: dict[str, Any], **kwargs):
        """The update's optimizer steps (RLlib's hook for a learner's own update
        step): one per minibatch of :class:`TrajectoryMinibatches`, each
        :meth:`optimizer_step`. Returns the last step's forward outputs and losses."""
        plan = dict(self.__dict__.pop("_plan", None) or {"num_epochs": 1, "seed": 0})
        if plan.get("num_minibatches") is None:
            counts = [len(torch.unique(b["row_trajectory"])) for b in batch.values()]
            plan["num_minibatches"] = num_minibatches(
                [max(counts, default=0)], plan.get("minibatch_size")
            )
        minibatches = TrajectoryMinibatches(
            MultiAgentBatch(batch, env_steps=0),
            num_minibatches=plan["num_minibatches"],
            num_epochs=plan["num_epochs"],
            shuffle=bool(plan.get("shuffle")),
            seed=plan["seed"],
        )
        fwd_out: dict[str, Any] = {}
        totals: dict[str, torch.Tensor] = {}
        for step, minibatch in enumerate(minibatches):
            # The first step's forward passes still have the update's weights.
            fwd_out, totals = self.optimizer_step(minibatch.policy_batches, first=step == 0)
        self._log_extra_epochs(batch, plan["num_epochs"])
        return fwd_out, totals, {}

    def _log_extra_epochs(self, batch: dict[str, Any], num_epochs: int) -> None:
        """RLlib counts the rows trained once per ``update`` call; a row trained in
        each of ``num_epochs`` passes counts once per pass, as under RLlib's own
        minibatch loop."""
        if num_epochs <= 1:
            return
        for mid, module_batch in batch.items():
            extra = len(module_batch) * (num_epochs - 1)
            for key, reduce in (
                ((mid, NUM_MODULE_STEPS_TRAINED), "sum"),
                ((mid, NUM_MODULE_STEPS_TRAINED_LIFETIME), "lifetime_sum"),
                ((ALL_MODULES, NUM_MODULE_STEPS_TRAINED), "sum"),
                ((ALL_MODULES, NUM_MODULE_STEPS_TRAINED_LIFETIME), "lifetime_sum"),
            ):
                run_log(self.metrics, key, extra, reduce=reduce, under=LEARNERS)
