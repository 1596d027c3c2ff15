"""The lockstep player: one-agent envs, every active trajectory's turn in one engine batch.

Each trajectory's env is reset with its seed and its first prompt put in
(:class:`~.turns.Turns`); then, turn by turn, the prompts of all trajectories
still playing go to the engine as one batch, each answer is handed to its env,
and a trajectory leaves the batch when its env ends it, at its turn limit, or
when its context would overflow. Between two turns of a training sample the
runner may load newer weights (partial rollouts: ``between_turns``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ragen_rllib.env_runner.players import Batch, Played, start_rollouts
from ragen_rllib.env_runner.rollout_state import Rollout


class LockstepPlayer:
    """Plays a batch of one-agent trajectories in lockstep with ``runner``'s engine."""

    def __init__(self, runner: Any, between_turns: Callable[[], None]) -> None:
        self.runner = runner
        self.between_turns = between_turns

    def play(self, batch: Batch) -> Played:
        runner, max_new = self.runner, batch.params.max_new_tokens
        rollouts = start_rollouts(runner, batch)
        # The N trajectories of a group start from one state, so from one first prompt:
        # each distinct first prompt is encoded once per call (encoding every copy was
        # over half the runner's own time per Bandit sample; bench_async.py --device-time).
        first_ids: dict = {}
        for roll in rollouts:
            runner.turns.begin(roll, batch.reset_kwargs, first_ids, max_new)
        runner.engine.clear_cache()
        generated = 0
        active = [r for r in rollouts if r.context is not None]
        for turn in range(1, max((r.limit for r in rollouts), default=0) + 1):
            if not active:
                break
            if turn > 1 and batch.training:
                self.between_turns()
            generated += sum(len(g.ids) for g in self._turn(active, batch, turn))
            active = [r for r in active if not r.traj.done]
        runner.engine.clear_cache()
        return Played([r.traj for r in rollouts], generated)

    def _turn(self, active: list[Rollout], batch: Batch, turn: int) -> list:
        """One engine batch: every active trajectory's answer, handed to its env."""
        runner = self.runner
        # Keyed by trajectory: a turn encodes only what its previous context lacks.
        gens = runner.engine.generate(
            [r.context.prompt for r in active],
            batch.params,
            seed=batch.sample_seed + turn,
            cache_keys=[id(r) for r in active],
        )
        for roll, gen in zip(active, gens, strict=True):
            runner.turns.play(roll, gen, turn, batch.params.max_new_tokens)
        return gens
