"""One trajectory's turns: its first prompt, an answer handed to its env, the next prompt.

:class:`Turns` holds what these steps need of the env runner (its engine's
policy version, its tokenizer, the context bound) and is shared by the
runner's lockstep loop and the self-play loop (:mod:`.self_play`). A turn is
two steps so that the self-play loop can put the next prompt in later, when
the other seat has moved: :meth:`Turns.take` records the answer and steps the
env, :meth:`Turns.follow` renders the observation as the next prompt.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from ragen_rllib.chat.prompts import reasoning_length, render_turn, with_instructions
from ragen_rllib.env_choice.env_loading import actions_left_of, success_of
from ragen_rllib.env_runner.rollout_state import (
    Rollout,
    WholeHistory,
    Window,
    check_observation,
    finite_reward,
)

logger = logging.getLogger(__name__)


class Turns:
    """The turn steps of the runner ``runner`` (its engine, tokenizer and config)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def begin(self, roll: Rollout, options: dict, first_ids: dict, max_new_tokens: int) -> None:
        """Reset the rollout's env and put in its first prompt (its context), or end it
        as an env error, or as a context overflow when no answer fits after it."""
        traj, fmt, config = roll.traj, roll.fmt, self.runner.config
        try:
            obs, info = roll.env.reset(seed=traj.seed, **options)
            check_observation(obs)
        except Exception as err:  # noqa: BLE001 - an env bug must not kill the batch
            roll.unplayable("env_error", f"reset(): {type(err).__name__}: {err}")
            return
        text = render_turn(1, obs, actions_left_of(info), None, fmt)
        traj.turn_observations.append(obs)
        traj.turn_prompts.append(with_instructions(roll.env.unwrapped, text, fmt))
        first = traj.turn_prompts[0]
        if (fmt, first) not in first_ids:
            first_ids[fmt, first] = roll.chat.prompt_ids(first)
        ids, bound = first_ids[fmt, first], config.max_context_tokens
        if len(ids) + max_new_tokens > bound:  # no turn can be played: its group goes
            why = f"first prompt of {len(ids)} tokens + max_new_tokens > max_context_tokens={bound}"
            roll.unplayable("context_overflow", why)
            return
        window = config.context_window
        if window is None:
            roll.context = WholeHistory(traj, roll.chat, list(ids))
        else:
            unwrapped = roll.env.unwrapped
            instructions = functools.partial(with_instructions, unwrapped, style=fmt)
            roll.context = Window(window, traj, roll.chat, ids, text, instructions)

    def play(self, roll: Rollout, gen, turn: int, max_new_tokens: int) -> bool:
        """Hand one answer to the env and record the turn; whether the rollout goes on."""
        step = self.take(roll, gen, turn)
        return step is not None and self.follow(roll, gen, turn, *step, max_new_tokens)

    def take(self, roll: Rollout, gen, turn: int) -> tuple[str, float, dict] | None:
        """Record the answer ``gen`` as turn ``turn`` and step the env with its text:
        (observation, reward, info) when the rollout goes on, None when it ended."""
        traj, engine = roll.traj, self.runner.engine
        roll.context.answer_begins()
        version, cut = engine.policy_version, not gen.ended_with_eos
        traj.append_generation(gen.ids, gen.behaviour_logp, version, cut)
        tokenizer = self.runner.tokenizer
        if self.runner.config.loss_tokens == "answer":
            traj.turn_reasoning_tokens.append(
                reasoning_length(tokenizer, roll.chat.prefill, gen.ids)
            )
        text = roll.chat.prefill + tokenizer.decode(gen.ids, skip_special_tokens=True)
        traj.answers.append(text)
        try:
            obs, reward, term, trunc, info = roll.env.step(text)
            check_observation(obs)
            reward = finite_reward(reward)
        except Exception as err:  # noqa: BLE001 - an env bug must not kill the batch
            traj.append_context(roll.chat.closing_ids(gen.ended_with_eos))
            roll.unplayable("env_error", f"step(): {type(err).__name__}: {err}")
            return None
        traj.turn_rewards.append(reward)
        traj.turn_infos.append(info)
        traj.success = success_of(info, reward)
        if term or trunc or turn == roll.limit:
            reason = "terminated" if term else "truncated" if trunc else "max_turns"
            roll.finish(gen.ended_with_eos, reason)
            return None
        return obs, reward, info

    def follow(
        self, roll: Rollout, gen, turn: int, obs: str, reward: float, info: dict, max_new: int
    ) -> bool:
        """Put in the prompt of turn ``turn + 1`` (the observation ``obs`` after the
        answer ``gen``); whether it fits in the context (else the rollout ends)."""
        traj = roll.traj
        user = render_turn(turn + 1, obs, actions_left_of(info), reward, roll.fmt)
        length = roll.context.following(user, gen.ids, gen.ended_with_eos)
        if length + max_new > self.runner.config.max_context_tokens:
            logger.info("trajectory seed %d ends: context would overflow", traj.seed)
            roll.finish(gen.ended_with_eos, "context_overflow")
            return False
        traj.turn_observations.append(obs)
        traj.turn_prompts.append(user)
        roll.context.advance()
        return True
