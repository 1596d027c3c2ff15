"""How a runner plays one batch of trajectories: one player per rollout mode.

:meth:`~ragen_rllib.env_runner.llm_env_runner.LLMEnvRunner.run_episodes` is the
one entry. It describes the batch (:class:`Batch`), hands it to the player of
the run's mode, and logs what the player reports (:class:`Played`):

==================  =====================================  ==========================
mode                player                                 who writes the answers
==================  =====================================  ==========================
lockstep            :class:`~.lockstep.LockstepPlayer`      the policy: every active
                                                           trajectory's turn in one
                                                           engine batch
self-play           :class:`~.self_play.player.            the policy (or an opponent
                    SelfPlayPlayer`                        snapshot) on both seats of
                                                           two-player games
agent programs      :class:`AgentPlayer` (here), over      the user's agent program,
                    :mod:`ragen_rllib.agents.programs`     whose model calls the
                                                           gateway serves
==================  =====================================  ==========================

A run with ``agent`` set plays agent programs; otherwise each batch's envs pick:
self-play when the run plays itself and every env of the batch is a self-play
game, lockstep when not (a self-play run's evaluation against a fixed opponent
plays one-agent envs in lockstep).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from ragen_rllib.agents.programs import AgentRollouts
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.env_choice.env_mix import format_of, turns_of
from ragen_rllib.env_choice.eval_suites import EvalEnv
from ragen_rllib.env_runner.rollout_state import Rollout
from ragen_rllib.records.trajectory import Trajectory


@dataclass
class Batch:
    """What one call plays: a trajectory per seed."""

    seeds: list[int]
    groups: list[int]  # each trajectory's group label
    params: SamplingParams
    sample_seed: int  # seeds the engine's sampling
    reset_options: dict | None = None  # a curriculum stage's, for every env's reset()
    training: bool = True  # a training sample (metrics logged, partial rollouts) or not
    split: str = "train"  # agent programs: which tasks ("train" or "eval")
    env: EvalEnv | None = None  # an evaluation suite's env, played by every seed
    #: the env of each trajectory and the mixture entry or suite it was made from
    #: (filled by the runner for the env modes; empty for agent programs)
    entries: list[EvalEnv] = field(default_factory=list)
    envs: list[Any] = field(default_factory=list)

    @property
    def reset_kwargs(self) -> dict:
        return {} if self.reset_options is None else {"options": self.reset_options}


@dataclass
class Played:
    """What a player reports: the trajectories the runner returns, the tokens
    generated (the trained policy's and any opponent's), and metrics of its own
    (logged under ``env_runners/`` after a training batch)."""

    trajectories: list[Trajectory]
    generated: int
    metrics: dict[str | tuple[str, ...], float] = field(default_factory=dict)


class Player(Protocol):
    def play(self, batch: Batch) -> Played: ...


def start_rollouts(runner: Any, batch: Batch) -> list[Rollout]:
    """One :class:`Rollout` per trajectory of ``batch``, with its prompt format, chat
    template and turn limit from its entry (nothing played yet)."""
    cfg, rollouts = runner.config, []
    for entry, env, seed, group in zip(
        batch.entries, batch.envs, batch.seeds, batch.groups, strict=True
    ):
        fmt = format_of(entry, cfg)
        chat = runner.chat_for(fmt)
        traj = Trajectory(
            env_id=entry.env,
            env_name=entry.name,
            seed=seed,
            group=group,
            policy_version=runner.engine.policy_version,
            prefill=chat.prefill,
        )
        rollouts.append(Rollout(traj, env, fmt, chat, turns_of(entry, cfg.max_turns)))
    return rollouts


class AgentPlayer:
    """Agent programs play each trajectory (``agent``): the calls, the gateway and the
    counts are :class:`~ragen_rllib.agents.programs.AgentRollouts`'."""

    def __init__(self, runner: Any) -> None:
        self.rollouts = AgentRollouts(runner.config, runner.engine, runner.tokenizer)

    def play(self, batch: Batch) -> Played:
        trajs, counts = self.rollouts.run(
            batch.seeds, batch.groups, batch.params, batch.split, batch.sample_seed
        )
        generated = sum(t.response_tokens for t in trajs)
        return Played(trajs, generated, {("agents", k): v for k, v in counts.items()})

    def shutdown(self) -> None:
        self.rollouts.shutdown()
