"""FreshnessBuffer: the rollout buffer that online-k reuse and asynchronous sampling share.

An RLlib replay buffer (``ReplayBufferInterface``) whose item is one rollout
batch (a list of :class:`~ragen_rllib.records.trajectory.Trajectory`). Two bounds keep
what it hands out fresh:

- **uses**: a batch is handed out at most ``online_k`` times, then dropped
  (online-k; ``k=1`` trains on every batch once);
- **policy lag**: a trajectory's lag is the learner's policy version at the
  update minus the version that generated it. Trajectories whose lag would
  exceed ``max_policy_lag`` are dropped and counted, never trained on.

With synchronous sampling the lag of a batch's ``j``-th use is ``j - 1``; with
asynchronous sampling (the runners sample batch ``i+1`` while the learner
updates on batch ``i``) every use is one version later than that. Every
trajectory handed out carries its ``uses`` and ``policy_lag``.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ray.rllib.utils.replay_buffers.base import ReplayBufferInterface

from ragen_rllib.records.trajectory import Trajectory


class FreshnessBuffer(ReplayBufferInterface):
    """Rollout batches, oldest first, with use counts and a policy-lag bound.

    Args:
        online_k: how many updates may use one batch (>= 1).
        max_policy_lag: the largest lag (in policy versions) a trajectory may
            have when it is trained on (>= 0).
    """

    def __init__(self, online_k: int = 1, max_policy_lag: int = 1):
        if online_k < 1 or max_policy_lag < 0:
            raise ValueError(
                f"online_k must be >= 1 and max_policy_lag >= 0, got {online_k}, {max_policy_lag}"
            )
        self.online_k = online_k
        self.max_policy_lag = max_policy_lag
        self._batches: deque[list[Trajectory]] = deque()
        self._uses: deque[int] = deque()
        #: trajectories dropped for lag, lifetime
        self.num_dropped_stale = 0

    def __len__(self) -> int:
        """Batches held (each has uses left)."""
        return len(self._batches)

    def add(self, batch: list[Trajectory], **kwargs) -> None:
        self._batches.append(list(batch))
        self._uses.append(0)

    def sample(
        self, num_items: int | None = None, *, policy_version: int = 0, **kwargs
    ) -> list[Trajectory] | None:
        """The oldest batch with uses left, without its too-stale trajectories, or None.

        ``policy_version`` is the learner's policy version for the update about
        to run. ``num_items`` is not used: the item is a whole batch.
        """
        while self._batches:
            batch = self._batches[0]
            fresh = [t for t in batch if policy_version - t.policy_version <= self.max_policy_lag]
            self.num_dropped_stale += len(batch) - len(fresh)
            uses = self._uses[0] + 1
            if not fresh or uses >= self.online_k:
                self._batches.popleft()
                self._uses.popleft()
            else:
                self._batches[0], self._uses[0] = fresh, uses
            if fresh:
                for t in fresh:
                    t.uses = uses
                    t.policy_lag = policy_version - t.policy_version
                return list(fresh)
        return None

    def has_fresh(self, policy_version: int) -> bool:
        """Whether :meth:`sample` at ``policy_version`` would hand out a batch."""
        return any(
            policy_version - t.policy_version <= self.max_policy_lag
            for batch in self._batches
            for t in batch
        )

    def get_state(self) -> dict[str, Any]:
        return {
            "batches": [list(b) for b in self._batches],
            "uses": list(self._uses),
            "num_dropped_stale": self.num_dropped_stale,
        }

    def set_state(self, state: dict[str, Any]) -> None:
        self._batches = deque(list(b) for b in state.get("batches", []))
        self._uses = deque(int(u) for u in state.get("uses", [0] * len(self._batches)))
        self.num_dropped_stale = int(state.get("num_dropped_stale", 0))
