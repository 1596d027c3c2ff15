"""StarPO's watch for collapse: the indicators logged every iteration, and the guard.

Every fresh rollout batch gives the reasoning-diversity indicators
(:mod:`ragen_rllib.maths.collapse`: distinct-1/2 of the think texts within the groups
and over the batch, and template repetition). Every ``collapse_metrics_interval``
iterations, M (prompt, reasoning) pairs of the batch's turns, first turns first
(:func:`turn_pairs`), are scored by the actor, every reasoning under every prompt, for
the prompt-reasoning information metrics. Every update gives the signals of
:class:`~ragen_rllib.maths.collapse.EarlyWarning` (the in-group reward std, the
approximate KL of the update's step, the actor's gradient norm, the policy's entropy),
whose EMAs are logged too. When the warning fires, ``collapse/warning`` holds its
iteration from then on, the reason is logged, and ``collapse_guard`` acts: ``off`` does
nothing more, ``checkpoint`` saves a checkpoint at once (in the trial's folder,
``checkpoint_collapse_warning_<iteration>``), ``stop`` ends the trial after this
iteration (its periodic checkpoints from before the warning stay where Tune keeps them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch

from ragen_rllib.chat.prompts import reasoning_length
from ragen_rllib.maths.collapse import (
    EarlyWarning,
    distinct_n,
    distinct_n_within_groups,
    own_reasoning,
    pair_information,
    template_repetition,
)
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.records.trajectory import Trajectory

GUARDS = ("off", "stop", "checkpoint")


def diversity_metrics(trajectories: list[Trajectory]) -> dict[str, float]:
    """The diversity of the model's own reasoning over a batch: every answer of every
    trajectory, its prefill removed (:func:`~ragen_rllib.maths.collapse.own_reasoning`)."""
    start = time.perf_counter()
    texts, groups = [], []
    for t in trajectories:
        for answer in t.answers:
            texts.append(own_reasoning(answer, t.prefill))
            groups.append(t.group)
    lengths = [len(text.split()) for text in texts]
    out = {
        # How long the reasoning is (whitespace words of the model's own think text).
        "think_words_mean": sum(lengths) / len(lengths) if lengths else 0.0,
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "distinct_1_in_group": distinct_n_within_groups(texts, groups, 1),
        "distinct_2_in_group": distinct_n_within_groups(texts, groups, 2),
        "template_repetition": template_repetition(texts),
    }
    out["diversity_s"] = time.perf_counter() - start
    return out


def turn_pairs(
    trajectories: list[Trajectory],
    samples: int,
    reasoning_tokens: Callable[[Trajectory, int, list[int]], int] | None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Up to ``samples`` (prompt ids, reasoning ids) pairs from the trajectories'
    turns, each with a different prompt: the first turns first (a group's rollouts
    share theirs, so at most one per group; two groups from the same state count
    once), then, where the batch has fewer distinct first prompts than ``samples``,
    the later turns in turn order (each a state of its own trajectory). An identical
    prompt would tie with a pair's own in every score, so retrieval could never pick
    it out. The reasoning is the turn's answer up to and including the tokens that
    close it (``</think>``): ``reasoning_tokens(trajectory, turn, answer_ids)`` says how
    many those are (0: the answer never closed it, or the prefill closed it already);
    the whole answer where it says 0 or is None."""
    prompts, reasonings, seen = [], [], set()
    turns = max((len(t.turn_spans) for t in trajectories), default=0)
    for turn in range(turns):
        for t in trajectories:
            if len(prompts) == samples:
                return prompts, reasonings
            if turn >= len(t.turn_spans) or t.turn_spans[turn][2] <= t.turn_spans[turn][1]:
                continue
            seg, start, _ = t.turn_spans[turn]
            prompt = t.segments[seg].input_ids[:start]
            if tuple(prompt) in seen:
                continue
            seen.add(tuple(prompt))
            answer = t.turn_ids(turn)
            cut = reasoning_tokens(t, turn, answer) if reasoning_tokens is not None else 0
            if cut > 0:
                answer = answer[:cut]
            prompts.append(list(prompt))
            reasonings.append(list(answer))
    return prompts, reasonings


#: Names the early warning's EMAs had before; a restored checkpoint is read with them.
RENAMED_EMA = {"in_group_std": "in_group_reward_std"}


class CollapseWatch:
    """The early warning over a run's iterations, its state kept in checkpoints."""

    def __init__(self, config: Any):
        self.config = config
        self._tokenizer: Any = None  # the run's tokenizer, loaded when first needed
        self.warning = EarlyWarning(
            alpha=config.collapse_ema,
            std_drop=config.collapse_std_drop,
            spike=config.collapse_spike,
            warmup=config.collapse_warmup,
            entropy_spike=config.collapse_entropy_spike,
        )
        self.stop_requested = False

    def observe(
        self, in_group_std: float, step_kl: float, grad_norm: float, entropy: float
    ) -> tuple[dict[str, float], str | None]:
        """One iteration's signals -> (the metrics to log, the reason if it fired now)."""
        reason = self.warning.update(in_group_std, step_kl, grad_norm, entropy)
        if reason is not None and self.config.collapse_guard == "stop":
            self.stop_requested = True
        metrics = {f"{k}_ema": v for k, v in self.warning.ema.items()}
        metrics["warning"] = self.warning.fired_at or 0
        return metrics, reason

    def information(
        self, learner_group: Any, trajectories: list[Trajectory], iteration: int
    ) -> dict[str, float]:
        """RAGEN-2's prompt-reasoning information on a batch's turns (first turns
        first), scored by the learners' actor (its current weights), with what it
        cost (``mi_s``) and the iteration it was computed at (``mi_iteration``; the
        results of the iterations between hold NaN for these keys)."""
        start = time.perf_counter()
        prompts, reasonings = turn_pairs(
            trajectories, self.config.collapse_mi_samples, self._reasoning_tokens
        )
        if len(prompts) < 2:  # one distinct first prompt (Bandit's): nothing to compare
            nan = float("nan")
            return {
                **dict.fromkeys(("mi", "mi_zscore", "conditional_entropy"), nan),
                **dict.fromkeys(("retrieval_acc_at_1", "retrieval_chance"), nan),
                "mi_samples": len(prompts),
                "mi_s": time.perf_counter() - start,
                "mi_iteration": iteration,
            }
        results = learner_group.foreach_learner(
            lambda learner: learner.pair_loglik(prompts, reasonings)
        )
        first = next(iter(results))  # every learner holds the whole actor's scores
        loglik = first.get() if hasattr(first, "get") else first
        if isinstance(loglik, BaseException):  # a remote learner's error, handed back
            raise loglik
        info = pair_information(torch.tensor(loglik), [len(z) for z in reasonings])
        return {
            "mi": info.mutual_information,
            "mi_zscore": info.mi_zscore,
            "mi_samples": len(prompts),
            "conditional_entropy": info.conditional_entropy,
            "retrieval_acc_at_1": info.retrieval_acc_at_1,
            f"retrieval_acc_at_{info.k}": info.retrieval_acc_at_k,
            "retrieval_chance": info.chance_at_1,
            "mi_s": time.perf_counter() - start,
            "mi_iteration": iteration,
        }

    @property
    def tokenizer(self) -> Any:
        """The run's tokenizer, loaded when first needed (a run that keeps the runner's
        reasoning counts, ``loss_tokens: answer``, never needs it)."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.config.llm))
        return self._tokenizer

    def _reasoning_tokens(self, trajectory: Trajectory, turn: int, answer: list[int]) -> int:
        """How many of a turn's answer tokens are its reasoning, ``</think>`` included
        (0: never closed, or closed by the prefill): the runner's count where
        ``loss_tokens: answer`` kept one, else found on the decoded text, so a tag the
        tokenizer splits in several tokens (SmolLM2's) ends the reasoning where it ends."""
        if turn < len(trajectory.turn_reasoning_tokens):
            return trajectory.turn_reasoning_tokens[turn]
        return reasoning_length(self.tokenizer, trajectory.prefill, answer)

    def get_state(self) -> dict[str, Any]:
        return asdict(self.warning)

    def set_state(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if key == "ema":  # a checkpoint from before a rename holds the old names
                value = {RENAMED_EMA.get(k, k): v for k, v in value.items()}
            setattr(self.warning, key, value)
