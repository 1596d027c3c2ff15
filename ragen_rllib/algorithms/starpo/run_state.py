"""What a StarPO checkpoint holds beyond RLlib's: the rollout buffer, the lifetime
counters, the seed stream's position, the policy version, the collapse watch, the
sample stage's state (RAE's running baselines) and the global random generators;
and the manifest of sizes and hashes that is written with every checkpoint and
checked before any restore.

A mixin of :class:`~ragen_rllib.algorithms.starpo.starpo.StarPO`.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

from ragen_rllib.algorithms.starpo.checkpoint import verify_checkpoint, write_manifest


class CheckpointStateMixin:
    """RLlib's state methods, extended with the driver's own state."""

    def get_state(self, *args, **kwargs) -> dict[str, Any]:
        state = super().get_state(*args, **kwargs)
        state["rollout_buffer"] = self._buffer.get_state()
        state["lifetime_counters"] = dict(self._lifetime)
        # A sample in flight is not saved: a restored run draws its seeds again.
        pending = self._request
        state["num_sample_calls"] = pending.call if pending else self._num_sample_calls
        state["policy_version"] = self._policy_version
        state["collapse_warning"] = self._collapse.get_state()
        state["sample_stage"] = self._sample_stage.get_state()  # RAE's baselines
        # Sampling and minibatch order draw from explicitly seeded generators; the
        # global ones are saved too, for anything (a user's env, say) that uses them.
        state["rng_states"] = {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)
        if "rollout_buffer" in state:
            self._buffer.set_state(state["rollout_buffer"])
        self._num_sample_calls = int(state.get("num_sample_calls", self._num_sample_calls))
        self._policy_version = int(state.get("policy_version", self._policy_version))
        self._request = None  # a sample in flight at save time is drawn again
        if "lifetime_counters" in state:
            self._lifetime.update(state["lifetime_counters"])
        if "collapse_warning" in state:
            self._collapse.set_state(state["collapse_warning"])
        if "sample_stage" in state:
            self._sample_stage.set_state(state["sample_stage"])
        if "rng_states" in state:
            random.setstate(state["rng_states"]["python"])
            np.random.set_state(state["rng_states"]["numpy"])
            torch.set_rng_state(state["rng_states"]["torch"])

    def save_to_path(self, *args, **kwargs) -> str:
        path = super().save_to_path(*args, **kwargs)
        write_manifest(path)  # sizes and hashes, checked before any restore
        return path

    def restore_from_path(self, path, *args, **kwargs) -> None:
        if kwargs.get("component") is None:
            verify_checkpoint(path)
        super().restore_from_path(path, *args, **kwargs)

    @classmethod
    def from_checkpoint(cls, path, *args, **kwargs):
        verify_checkpoint(path)  # before RLlib unpickles anything
        return super().from_checkpoint(path, *args, **kwargs)
