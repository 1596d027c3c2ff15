"""Rollout engines: token ids in, sampled token ids and their log-probabilities out.

Sits inside the env runner. The env runner gives the engine the token ids of
every active trajectory at a turn; the engine samples one answer per
trajectory, in one batch, and returns the sampled ids with the log-probability
of each under the temperature-scaled distribution ``softmax(logits / T)``
(before top-p truncation): the behaviour log-probs. The learner recomputes
exactly that quantity, so the behaviour log-probs and the first update's
``logp_new`` agree (token in, token out).

Two engines meet this contract: :class:`~ragen_rllib.engines.hf_engine.HFEngine`
(transformers, the CPU default) and
:class:`~ragen_rllib.engines.vllm_engine.VLLMEngine`.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

import torch

from ragen_rllib.engines.stops import StopStrings


@dataclass(frozen=True)
class SamplingParams:
    """temperature: softmax temperature (0 means greedy); top_p: nucleus mass kept;
    max_new_tokens: tokens generated per turn at most; stop: text that ends an answer
    at the token completing it (:mod:`~ragen_rllib.engines.stops`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64
    stop: StopStrings | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """One sampled answer: its ids (the eos id included when it stopped there),
    their behaviour log-probs, and whether it ended with eos."""

    ids: list[int]
    behaviour_logp: list[float]
    ended_with_eos: bool


@dataclass(frozen=True)
class GenerateRequest:
    """One :meth:`RolloutEngine.generate` call, checked: the prompts' token ids, how to
    sample, the call's seed, and one cache key per prompt (or None)."""

    prompts: list[list[int]]
    params: SamplingParams
    seed: int
    cache_keys: list[Hashable] | None = None


class RolloutEngine:
    """What the env runner needs from an inference engine (see the module docstring).

    An engine sets ``model`` (checked by the runner's health check) and implements
    :meth:`_generate`, :meth:`_load_weights`, if it keeps per-trajectory state
    :meth:`clear_cache`, and, if it can free memory for a learner on its device,
    :meth:`_sleep` and :meth:`_wake`."""

    #: the policy version of the weights loaded (0: the initial model)
    policy_version: int = 0
    #: what :meth:`release` frees: 0 nothing, 1 the caches (weights to host memory),
    #: 2 the caches and the weights
    sleep_level: int = 0
    #: released and not yet given new weights
    asleep: bool = False
    #: the engine's lifecycle, oldest first: ("load" | "release" | "wake", policy
    #: version, detail), the last 64 (for checks and logs)
    events: list[tuple[str, int, str]] = []
    #: prompt tokens taken from the prefix cache instead of encoded, lifetime
    prompt_tokens_reused: int = 0
    model: Any = None

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        seed: int,
        cache_keys: list[Hashable] | None = None,
    ) -> list[Generation]:
        """One answer per prompt, sampled with ``params`` from a generator seeded by
        ``seed``. ``cache_keys`` (one per prompt, e.g. the trajectory) let an engine
        reuse what it computed for the same key at the previous turn."""
        if cache_keys is not None and len(cache_keys) != len(prompts):
            raise ValueError(f"{len(cache_keys)} cache keys for {len(prompts)} prompts")
        if not prompts:
            return []
        return self._generate(GenerateRequest(prompts, params, int(seed), cache_keys))

    def _generate(self, request: GenerateRequest) -> list[Generation]:
        raise NotImplementedError

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Load the actor's weights (the rollout model's names) stamped ``version``;
        an engine that was released wakes first."""
        if self.asleep:
            self._wake()
            self.asleep = False
            self._log_event("wake", "")
        self._load_weights(state_dict, version)
        self._log_event("load", f"version {version}")

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        raise NotImplementedError

    def release(self) -> str:
        """Free memory for the learner's update, at :attr:`sleep_level`; the next
        :meth:`load_weights` wakes the engine. Returns what was done ("slept", or why
        it was skipped); no sampling may happen in between."""
        if self.sleep_level == 0:
            return "skipped: sleep_level 0"
        self.clear_cache()
        done = self._sleep(self.sleep_level)
        self.asleep = done == "slept"
        self._log_event("release", done)
        return done

    def _sleep(self, level: int) -> str:
        return "skipped: this engine cannot release memory"

    def _wake(self) -> None:
        """Undo :meth:`_sleep` (memory back, ready for new weights)."""

    def _log_event(self, what: str, detail: str) -> None:
        """Keep (what, policy version, detail) in :attr:`events`, the last 64."""
        self.events = [*self.events[-63:], (what, self.policy_version, detail)]

    def clear_cache(self) -> None:
        """Forget every per-trajectory cache (call when its trajectories end)."""
