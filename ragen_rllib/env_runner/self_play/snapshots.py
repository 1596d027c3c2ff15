"""A runner's opponents: snapshots of the trained policy that play the other seat.

With opponent policies (:mod:`ragen_rllib.env_runner.self_play.seats`) each game of a
self-play batch seats its two rollouts by the config's policy mapping. Rollouts
of the trained policy generate with the runner's engine; an opponent's generate
with an engine of its own (made on first use from the same model) that holds
one snapshot of the trained policy's weights.

Snapshots: the weights the engine was made with, then (with
``opponent_snapshot_interval`` N > 0) a copy of every N-th weight update the
runner receives, the last ``opponent_pool_size`` kept. Each sample draws one
snapshot per opponent policy, uniformly over those kept (seeded by the sample's
seed), and every game of the sample that seats that policy plays it. Only the
trained policy's trajectories leave the runner.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

from ragen_rllib.env_runner.self_play.seats import GameRef, OpponentSetup, game_number

#: the snapshot the opponent engines are made with (the model at the start of the run)
INITIAL = -1


def _copy(weights: dict[str, Any]) -> dict[str, Any]:
    return {
        k: v.detach().to("cpu", copy=True) if torch.is_tensor(v) else np.array(v, copy=True)
        for k, v in weights.items()
    }


class Opponents:
    """The snapshots, the opponent engines, and which policy plays which rollout."""

    def __init__(self, setup: OpponentSetup, every: int, keep: int, make_engine) -> None:
        self.setup = setup
        self.every, self.keep = every, keep
        self._make_engine = make_engine
        # (version, weights); INITIAL's weights are the model's own, read on first use
        self.snapshots: deque[tuple[int, dict | None]] = deque([(INITIAL, None)], maxlen=keep)
        self.engines: dict[str, Any] = {}
        #: policy -> the snapshot version its engine holds (None: none, it was released)
        self.loaded: dict[str, int | None] = {}
        self.playing: dict[str, int] = {}  # policy -> this sample's snapshot version

    # ----- snapshots -------------------------------------------------------------
    def record(self, weights: dict[str, Any], version: int) -> None:
        """A weight update the runner loaded: kept when it falls on the interval."""
        if self.every and version > 0 and version % self.every == 0:
            if all(v != version for v, _ in self.snapshots):
                self.snapshots.append((version, _copy(weights)))

    def draw(self, sample_seed: int) -> None:
        """This sample's snapshot for each opponent policy."""
        rng = np.random.default_rng([abs(int(sample_seed)), len(self.snapshots)])
        self.playing = {
            policy: self.snapshots[int(rng.integers(len(self.snapshots)))][0]
            for policy in self.setup.opponents
        }

    def engine(self, policy: str):
        """The engine of ``policy`` holding this sample's snapshot."""
        if policy not in self.engines:
            engine = self._make_engine()
            self.engines[policy] = engine
            self.loaded[policy] = INITIAL
            if self.snapshots[0][0] == INITIAL and self.snapshots[0][1] is None:
                self.snapshots[0] = (INITIAL, _copy(engine.model.state_dict()))
        version = self.playing.get(policy, INITIAL)
        if self.loaded[policy] != version:
            weights = dict(self.snapshots)[version]
            self.engines[policy].load_weights(weights, max(version, 0))
            self.loaded[policy] = version
        return self.engines[policy]

    def release(self) -> None:
        """Free the opponent engines' memory for the learner's update, as the trained
        policy's engine does (``engine_sleep_level``); each is woken by reloading its
        snapshot when next played."""
        for policy, engine in self.engines.items():
            if engine.release() == "slept":
                self.loaded[policy] = None  # its weights are gone: load them again

    def clear_caches(self) -> None:
        for engine in self.engines.values():
            engine.clear_cache()

    # ----- seats -------------------------------------------------------------------
    def seat(self, rollouts: list, seeds: list[int], groups: list[int]) -> None:
        """Set each rollout's ``policy`` (None: the trained one). Rollouts 2k and 2k+1
        are the two seats of a game; group g's j-th game is game g * n + j, n the
        group's games, so the numbering is the same whichever runner plays it."""
        sizes: dict[int, int] = {}
        for group in groups:
            sizes[group] = sizes.get(group, 0) + 1
        index: dict[int, int] = {}
        known = {self.setup.trained, *self.setup.opponents}
        for k in range(0, len(rollouts), 2):
            group = groups[k]
            j = index[group] = index.get(group, -1) + 1
            game = GameRef(game_number(int(group), j, sizes[group] // 2), int(seeds[k]))
            pair = self.setup.seat(game)
            odd = sorted(set(pair) - known)
            if odd:
                raise ValueError(
                    f"policy_mapping_fn returned {odd} for game {game.id_}: not among the "
                    f"policies {sorted(known)}"
                )
            for rollout, policy in zip(rollouts[k : k + 2], pair, strict=True):
                rollout.policy = None if policy == self.setup.trained else policy

    def kept(self, rollouts: list) -> list:
        """The trajectories the runner returns: the trained policy's. A game whose
        opponent could not play fails its trained seat too (its group then leaves the
        update, counted once as an env error)."""
        out = []
        for k in range(0, len(rollouts), 2):
            pair = rollouts[k : k + 2]
            failed = next((r for r in pair if r.policy is not None and r.traj.unplayable), None)
            for rollout in pair:
                if rollout.policy is not None:
                    continue
                if failed is not None and not rollout.traj.unplayable:
                    rollout.traj.error = f"its opponent's seat failed: {failed.traj.error}"
                    rollout.traj.end_reason, rollout.traj.success = "env_error", False
                out.append(rollout.traj)
        return out

    def metrics(self) -> dict[str, float]:
        """The snapshots kept, and the mean weight update that this sample's opponents
        played (0: the start's weights)."""
        return {
            "opponent/snapshots_kept": float(len(self.snapshots)),
            "opponent/snapshot_version_mean": float(
                np.mean([max(v, 0) for v in self.playing.values()]) if self.playing else 0.0
            ),
        }
