"""A two-player PettingZoo AEC text env as the two seats of self-play.

PettingZoo's agent-environment-cycle API (``possible_agents``,
``agent_selection``, ``observe``, ``step``, ``rewards``, ``terminations``,
``truncations``, ``infos``) is how turn-based multi-agent envs are written.
An AEC env whose observations are text and whose actions are the model's
answer text trains with ``env: my_games:env`` (PettingZoo's ``env()``
factory convention) and ``self_play: true``: :class:`AECSeat` is one seat of
such an env, with the self-play interface the env runner pairs seats by
(:mod:`ragen_rllib.env_runner.self_play.games`). Nothing here imports PettingZoo:
any object with that API works.

A seat's reward is what the AEC env gave its agent since its last answer (its
own step's and the other agent's steps' rewards); once the game is over, what
is left is paid to the seat whose turn it was not (:meth:`AECSeat.settle`).
``instructions(agent)``, when the env has it, opens the seat's first prompt.
"""

from __future__ import annotations

import string
from collections.abc import Callable
from typing import Any

import gymnasium as gym


def is_aec_env(env: Any) -> bool:
    """Whether ``env`` looks like a PettingZoo AEC env (duck-typed)."""
    return all(hasattr(env, name) for name in ("possible_agents", "observe", "step", "last"))


class _Shared:
    """One AEC game and each agent's reward not yet handed to its seat."""

    def __init__(self, aec: Any) -> None:
        self.aec = aec
        self.pending: dict[str, float] = {}

    def collect(self) -> None:
        for agent, reward in (getattr(self.aec, "rewards", None) or {}).items():
            self.pending[agent] = self.pending.get(agent, 0.0) + float(reward)

    def over(self, agent: str) -> bool:
        aec = self.aec
        return (
            agent not in aec.agents
            or bool(aec.terminations.get(agent))
            or bool(aec.truncations.get(agent))
        )


class AECSeat(gym.Env):
    """One seat (an agent of ``possible_agents``, by position) of an AEC text env."""

    metadata = {"render_modes": []}
    self_play = True

    def __init__(self, factory: Callable[[], Any]) -> None:
        self._factory = factory
        aec = factory()
        if not is_aec_env(aec):
            raise TypeError(f"{factory!r} made a {type(aec).__name__}, not a PettingZoo AEC env")
        if len(aec.possible_agents) != 2:
            raise ValueError(
                f"a self-play env has two agents; {type(aec).__name__} has "
                f"{len(aec.possible_agents)}: {list(aec.possible_agents)}"
            )
        self._shared = _Shared(aec)
        self.seat_choice: int | str = 0
        self._done = False
        self._owns = True
        if callable(getattr(aec, "instructions", None)):  # opens the seat's first prompt
            self.instructions = lambda: str(self._shared.aec.instructions(self.agent))
        self.observation_space = gym.spaces.Text(max_length=1 << 16, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=1 << 16, charset=string.printable)

    @property
    def agent(self) -> str:
        return self._shared.aec.possible_agents[int(self.seat_choice)]

    # ----- the self-play interface ---------------------------------------------
    def join(self, first: AECSeat) -> None:
        self._shared, self._owns = first._shared, False

    def own_game(self) -> None:
        if not self._owns:
            self._shared = _Shared(self._factory())
        self._owns = True

    @property
    def waiting(self) -> bool:
        aec = self._shared.aec
        return not self._shared.over(self.agent) and aec.agent_selection != self.agent

    def observe(self) -> str:
        return str(self._shared.aec.observe(self.agent))

    def settle(self) -> float | None:
        if self._done or not self._shared.over(self.agent):
            return None
        self._done = True
        return self._shared.pending.pop(self.agent, 0.0)

    def result_info(self) -> dict[str, Any]:
        return self._info()

    def _info(self) -> dict[str, Any]:
        """The AEC env's info for this seat's agent, with ``seat`` (RAE's baseline key)."""
        return {**dict(self._shared.aec.infos.get(self.agent, {})), "seat": int(self.seat_choice)}

    # ----- gymnasium -----------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if self._owns:
            self._shared.aec.reset(seed=seed, options=options)
            self._shared.pending = {}
        self._done = False
        return self.observe(), self._info()

    def step(self, action: str):
        aec, shared = self._shared.aec, self._shared
        if aec.agent_selection != self.agent or shared.over(self.agent):
            raise RuntimeError(f"seat {self.agent} stepped when it was not to move")
        aec.step(action)
        shared.collect()
        reward = shared.pending.pop(self.agent, 0.0)
        terminated = bool(aec.terminations.get(self.agent, self.agent not in aec.agents))
        truncated = bool(aec.truncations.get(self.agent)) and not terminated
        self._done = terminated or truncated
        return self.observe(), reward, terminated, truncated, self._info()
