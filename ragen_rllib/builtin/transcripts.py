"""Random-play transcripts of every built-in env, rendered exactly as rollouts render them.

What the built-in model reads before reinforcement learning: its vocabulary is
mined from these texts (:mod:`ragen_rllib.builtin.tokenizer`) and it is
pretrained on them (:mod:`ragen_rllib.builtin.pretraining`). Every answer is
:func:`random_answer`: a few filler words, then valid actions drawn uniformly
(on a free-text env, its random agent's answer, which reads the state only to
be accepted: the given numbers, the free cells), never aimed at the goal, so the
transcripts hold no policy.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

import ragen_envs
from ragen_envs.core.base import INSTRUCTION_STYLES
from ragen_rllib.builtin.spec import BuiltinSpec
from ragen_rllib.chat.prompts import (
    PROMPT_STYLES,
    ChatFormat,
    render_turn,
    system_prompt_for,
    with_instructions,
)

SEPARATOR = "||"
#: Words the think text of the pretraining transcripts is drawn from.
FILLER_WORDS = ("let", "me", "think", "I", "will", "go", "try", "this", "move", "next", "then")


def random_answer(
    rng: np.random.Generator, env: Any, arm: str | None = None, think: str | None = None
) -> str:
    """A pretraining answer after the ``<think>`` prefill: a few filler words (or the
    given ``think`` text), then uniformly random valid actions (one to three, at
    most the env's ``max_actions_per_turn``; one arm
    for the bandits, ``arm`` when given), or for a free-text env its random
    well-formed answer (``env.random_actions``: an expression over the numbers,
    placements in free cells, a number, a search). None of it aims at the goal: the
    transcripts show the format and what answers do, not a policy."""
    if think is None:
        think = " ".join(rng.choice(FILLER_WORDS, size=int(rng.integers(1, 5))))
    names = env.action_names
    if not names:  # free text
        actions = f" {env.parser.separator} ".join(env.random_actions(rng))
    elif env.action_budget == 1:  # the bandits: one arm
        actions = arm if arm is not None else names[int(rng.integers(len(names)))]
    else:  # one to three, within what the env executes in a turn
        count = int(rng.integers(1, min(3, env.parser.max_actions) + 1))
        actions = f" {SEPARATOR} ".join(names[int(i)] for i in rng.integers(len(names), size=count))
    return f" {think} </think> <answer> {actions} </answer>"


class TranscriptCorpus:
    """Transcripts of random play, rendered exactly as rollouts render them.

    Each transcript draws its prompt style (``compact`` with probability
    ``spec.compact_share``, else ``full``) and, independently, the env's
    instruction style the same way, so the model reads all four combinations.
    On the grid envs a share ``spec.coordinates_share`` of the episodes also
    shows the env's ``coordinates`` line under each grid. Every turn's answer is
    :func:`random_answer`: its actions are uniform over the valid ones and never
    depend on the state, so the corpus holds no policy.
    """

    def __init__(self, tokenizer: Any, spec: BuiltinSpec):
        self.spec = spec
        self.tokenizer = tokenizer
        self.env_ids = sorted(ragen_envs.BUILTIN_MODEL_ENV_IDS)
        self.envs = {
            (env_id, style, coords): gym.make(
                env_id, instructions=style, coordinates=coords
            ).unwrapped
            for env_id in self.env_ids
            for style in INSTRUCTION_STYLES
            for coords in (False, True)
            if not coords or gym.make(env_id).unwrapped.landmark_symbols
        }
        self.formats = {
            style: ChatFormat(tokenizer, system_prompt=system_prompt_for(style), prefill="<think>")
            for style in PROMPT_STYLES
        }
        # Bandit arms are pulled in turn, by name, so that every name is pulled equally
        # often in every stretch of the corpus: uniform draws leave a chance excess of
        # one name in the last batches, which the model keeps as a preference.
        self._pulls = dict.fromkeys(self.env_ids, 0)

    def next_arm(self, env_id: str) -> str | None:
        """The arm the next transcript of a bandit ``env_id`` pulls (None: not a bandit)."""
        env = self.envs[(env_id, "compact", False)]
        if env.action_budget != 1 or not env.action_names:  # free text: no arms
            return None
        names = sorted(arm.name for arm in env.arms)
        self._pulls[env_id] += 1
        return names[(self._pulls[env_id] - 1) % len(names)]

    def _style(self, rng: np.random.Generator) -> str:
        return "compact" if rng.random() < self.spec.compact_share else "full"

    def _env(self, rng: np.random.Generator, env_id: str) -> tuple[Any, str]:
        """(env, prompt style): the instruction and prompt styles and the coordinates
        line drawn for one episode."""
        prompt_style, instructions = self._style(rng), self._style(rng)
        coords = rng.random() < self.spec.coordinates_share
        env = (
            self.envs.get((env_id, instructions, coords))
            or self.envs[(env_id, instructions, False)]
        )
        return env, prompt_style

    def transcript(
        self, rng: np.random.Generator, env_id: str, arm: str | None = None
    ) -> tuple[list[int], list[int]]:
        """(token ids, kinds): kind 0 = prompt and framing, 1 = answer, 2 = observation text.

        The episode runs until the env ends it, ``spec.pretrain_max_turns`` answers, or
        the answer that takes the transcript past ``spec.pretrain_max_tokens`` tokens.
        ``arm``: the arm a bandit transcript pulls (default: a uniform draw).
        """
        env, prompt_style = self._env(rng, env_id)
        fmt = self.formats[prompt_style]
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        first = render_turn(1, obs, info["actions_left"], None, prompt_style)
        ids = fmt.prompt_ids(with_instructions(env, first, prompt_style))
        kinds = [0] * len(ids)
        for turn in range(1, self.spec.pretrain_max_turns + 1):
            answer = random_answer(rng, env, arm)
            answer_ids = self.tokenizer.encode(answer, add_special_tokens=False)
            answer_ids.append(fmt.eos_token_id)
            ids, kinds = ids + answer_ids, kinds + [1] * len(answer_ids)
            obs, reward, terminated, truncated, info = env.step("<think>" + answer)
            long = len(ids) >= self.spec.pretrain_max_tokens
            if terminated or truncated or long or turn == self.spec.pretrain_max_turns:
                closing = fmt.closing_ids(ended_with_eos=True)
                return ids + closing, kinds + [0] * len(closing)
            user = render_turn(turn + 1, obs, info["actions_left"], reward, prompt_style)
            more = fmt.continuation_ids(user, ended_with_eos=True)
            ids, kinds = ids + more, kinds + [2] * len(more)
        raise AssertionError("unreachable")

    def snapshot(
        self, rng: np.random.Generator, env_id: str, arm: str | None = None
    ) -> tuple[list[int], list[int]]:
        """(token ids, kinds) of one turn as a context window of 0 renders it: random play
        for 0 to ``spec.pretrain_max_turns - 1`` turns (while the episode lasts), then the
        instructions with that turn's observation, and one answer."""
        env, prompt_style = self._env(rng, env_id)
        fmt = self.formats[prompt_style]
        obs, info = env.reset(seed=int(rng.integers(2**31)))
        turn, reward = 1, None
        for _ in range(int(rng.integers(self.spec.pretrain_max_turns))):
            answer = random_answer(rng, env)
            nxt, nxt_reward, terminated, truncated, nxt_info = env.step("<think>" + answer)
            if terminated or truncated:
                break
            obs, reward, info, turn = nxt, nxt_reward, nxt_info, turn + 1
        text = render_turn(turn, obs, info["actions_left"], reward, prompt_style)
        ids = fmt.prompt_ids(with_instructions(env, text, prompt_style))
        answer_ids = self.tokenizer.encode(
            random_answer(rng, env, arm), add_special_tokens=False
        ) + [fmt.eos_token_id]
        closing = fmt.closing_ids(ended_with_eos=True)
        kinds = [0] * len(ids) + [1] * len(answer_ids) + [0] * len(closing)
        return ids + answer_ids + closing, kinds
