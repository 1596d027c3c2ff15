"""The self-play player: both seats of two-player games, each seat its own trajectory.

The batch's envs pair up by group (:func:`~.games.seat_envs`); with opponent
policies each game's seats are mapped to a policy and this sample's snapshot
of each opponent is drawn (:class:`~.snapshots.Opponents`); the games are then
played round by round to their end (:func:`~.games.play_games`). Without
opponents the runner returns both seats' trajectories; with them, only the
trained policy's.
"""

from __future__ import annotations

from typing import Any

from ragen_rllib.env_runner.players import Batch, Played, start_rollouts
from ragen_rllib.env_runner.self_play.games import play_games, seat_envs
from ragen_rllib.env_runner.self_play.snapshots import Opponents


class SelfPlayPlayer:
    """Plays a batch of self-play games with ``runner``'s engine (and ``opponents``'
    engines, for the seats an opponent policy plays)."""

    def __init__(self, runner: Any, opponents: Opponents | None) -> None:
        self.runner = runner
        self.opponents = opponents

    def play(self, batch: Batch) -> Played:
        runner, opponents = self.runner, self.opponents
        seat_envs(batch.envs, batch.groups)  # the group's envs pair up, two seats a game
        rollouts = start_rollouts(runner, batch)
        runner.engine.clear_cache()
        if opponents is not None:  # which policy plays each seat
            opponents.seat(rollouts, batch.seeds, batch.groups)
            opponents.draw(batch.sample_seed)
            opponents.clear_caches()

        def generate(prompts, keys, offset: int, policy: str | None = None):
            engine = runner.engine if policy is None else opponents.engine(policy)
            seed = batch.sample_seed + offset
            return engine.generate(prompts, batch.params, seed=seed, cache_keys=keys)

        generated = play_games(
            runner.turns, rollouts, generate, batch.reset_kwargs, batch.params.max_new_tokens
        )
        runner.engine.clear_cache()
        if opponents is None:
            return Played([r.traj for r in rollouts], generated)
        opponents.clear_caches()
        # the trained policy's trajectories
        return Played(opponents.kept(rollouts), generated, opponents.metrics())
