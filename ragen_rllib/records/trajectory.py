"""The trajectory record: one multi-turn episode as tokens, from ``reset()`` to the loss.

The env runner writes it turn by turn (the ids the engine saw and sampled, each
turn's reward and observation); the sample-batch stage may add one advantage per
turn (critic-free estimators); the rollout buffer stamps how often it was used and
its policy lag when it hands it to an update. The learner connector reads it into
token tensors. A trajectory's ids are exactly the ids the engine saw and sampled
(token in, token out: generated text is never re-tokenised): sampled ids carry a
response mask of 1 and their behaviour log-probs (the sampling policy's); every
other id (system prompt, observations, chat framing, the ``<think>`` prefill) has
mask 0.

RLlib calls these objects "episodes" in its connector and learner APIs
(``episodes=``); in this project they are always :class:`Trajectory` objects.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any


class _FillsNewFields:
    """Unpickling a record saved before a field existed (a checkpoint's buffered
    trajectories) gives that field its default instead of leaving it missing."""

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        for f in fields(self):
            if f.name not in self.__dict__:
                value = f.default_factory() if f.default_factory is not MISSING else f.default
                self.__dict__[f.name] = value


@dataclass
class Segment(_FillsNewFields):
    """One training sequence of a trajectory: token ids, with a response mask of 1 on
    the generated tokens, their behaviour log-probs (0 elsewhere) and the policy
    version of the weights that generated each (-1 on context tokens)."""

    input_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    behaviour_logp: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.input_ids)

    def append_context(self, ids: list[int]) -> None:
        self.input_ids.extend(ids)
        self.response_mask.extend([0] * len(ids))
        self.behaviour_logp.extend([0.0] * len(ids))
        self.versions.extend([-1] * len(ids))

    def append_generation(
        self, ids: list[int], behaviour_logp: list[float], version: int = 0
    ) -> tuple[int, int]:
        """Append ids sampled with the weights of policy ``version``; return their
        (start, end) slice in this segment."""
        if len(ids) != len(behaviour_logp):
            raise ValueError(f"{len(ids)} generated ids but {len(behaviour_logp)} log-probs")
        start = len(self.input_ids)
        self.input_ids.extend(ids)
        self.response_mask.extend([1] * len(ids))
        self.behaviour_logp.extend(float(x) for x in behaviour_logp)
        self.versions.extend([int(version)] * len(ids))
        return start, len(self.input_ids)


@dataclass
class Trajectory(_FillsNewFields):
    """One multi-turn episode as tokens: what the env runner returns and the learner trains on.

    ``segments`` are the training sequences. With the whole history in context
    (``context_window: null``) a trajectory is one segment that grows turn by
    turn, exactly the ids the engine saw at its last turn plus the last answer.
    With a context window, every turn is its own segment: the (windowed) prompt
    the engine saw at that turn, then the turn's answer.

    ``turn_spans[i] = (segment, start, end)``: where turn i's generated tokens
    lie; ``turn_rewards[i]`` is its reward (env reward plus format penalty) and
    ``turn_observations[i]`` the observation the turn answered, ``turn_prompts[i]``
    the user message it was shown (the instructions included at the first turn).
    """

    env_id: str
    seed: int
    group: int
    #: the env's name in the run's mixture (``env_mix``; the id's short name without
    #: one): per-env metrics, ``reward_norm_grouping: env`` and ``filter_scope: env``
    #: group by it
    env_name: str = ""
    segments: list[Segment] = field(default_factory=list)
    turn_spans: list[tuple[int, int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    turn_observations: list[str] = field(default_factory=list)
    turn_prompts: list[str] = field(default_factory=list)
    turn_infos: list[dict[str, Any]] = field(default_factory=list)
    #: per turn: the answer was cut by max_new_tokens (it ended without eos)
    turn_cut: list[bool] = field(default_factory=list)
    #: per turn, with ``loss_tokens: answer``: how many of its generated tokens are its
    #: reasoning (up to and including ``</think>``; 0: it never closed it); empty otherwise
    turn_reasoning_tokens: list[int] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # each: the prefill + the decoded text
    prefill: str = ""  # the text the runner placed before every generation
    done: bool = False
    success: bool = False
    #: why the trajectory ended: "terminated", "truncated", "max_turns", "context_overflow",
    #: or "env_error" (the env raised in reset() or step(); ``error`` says what).
    end_reason: str = ""
    error: str = ""
    #: the policy version (learner updates so far) whose weights generated this
    #: trajectory; the buffer sets ``policy_lag`` (the learner's policy version at
    #: the update minus this) and ``uses`` (how many updates have used it, this one
    #: included) when it hands the trajectory out
    policy_version: int = 0
    policy_lag: int = 0
    uses: int = 0
    #: Critic-free estimators (GRPO, GiGPO): one advantage per turn, set by the sample
    #: stage from the whole group; GRPO gives every turn the same value.
    turn_advantages: list[float] = field(default_factory=list)

    def __len__(self) -> int:
        # RLlib counts "env steps" with len(episode); a turn is one env step.
        return len(self.turn_rewards)

    @property
    def num_turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def unplayable(self) -> bool:
        """Ended without a true return: the env raised, or the first prompt left no
        room for an answer (``context_overflow`` before any turn)."""
        return self.end_reason == "env_error" or (
            self.end_reason == "context_overflow" and not self.turn_rewards
        )

    @property
    def total_reward(self) -> float:
        return float(sum(self.turn_rewards))

    @property
    def response_tokens(self) -> int:
        return sum(sum(s.response_mask) for s in self.segments)

    @property
    def num_tokens(self) -> int:
        """Tokens in all training sequences (what the learner processes)."""
        return sum(len(s) for s in self.segments)

    def turn_ids(self, turn: int) -> list[int]:
        """The generated ids of ``turn``."""
        seg, start, end = self.turn_spans[turn]
        return self.segments[seg].input_ids[start:end]

    def start_segment(self, ids: list[int]) -> None:
        """Open a new training sequence with the context ``ids`` (a turn's prompt)."""
        self.segments.append(Segment())
        self.segments[-1].append_context(ids)

    def append_context(self, ids: list[int]) -> None:
        """Context ids at the end of the current segment (response mask 0)."""
        if not self.segments:
            self.segments.append(Segment())
        self.segments[-1].append_context(ids)

    def append_generation(
        self,
        ids: list[int],
        behaviour_logp: list[float],
        version: int | None = None,
        cut: bool = False,
    ) -> None:
        """One turn's sampled ids, at the end of the current segment (response mask 1),
        generated by the weights of policy ``version`` (default: the trajectory's);
        ``cut``: the answer stopped at max_new_tokens, not at eos."""
        version = self.policy_version if version is None else version
        start, end = self.segments[-1].append_generation(ids, behaviour_logp, version)
        self.turn_cut.append(bool(cut))
        self.turn_spans.append((len(self.segments) - 1, start, end))


def env_name(traj: Trajectory) -> str:
    """The trajectory's env in the run's mixture (its id when no name was set)."""
    return traj.env_name or traj.env_id
