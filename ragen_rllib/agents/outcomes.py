"""How an agent call ends its trajectory: the agent's return value read as rewards
(:func:`agent_outcome`, the contract), or the failure, and what is counted
(:func:`ended_by`)."""

from __future__ import annotations

import logging
import math
import numbers
from typing import Any

import numpy as np

from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger("ragen_rllib.agents.programs")


class RewardOutOfBounds(ValueError):
    """A reward beyond ``agent_max_abs_reward`` (counted apart from other errors)."""


def agent_outcome(
    result: Any, turns: int, max_abs: float = float("inf")
) -> tuple[list[float], bool]:
    """An agent's return value -> (per-turn rewards, success); ValueError saying
    what is allowed, :class:`RewardOutOfBounds` for a reward, a turn reward or their
    sum beyond ``max_abs`` (which would swamp a group's normalisation)."""
    allowed = (
        "an agent returns a number (the reward) or a dict with 'reward', optional "
        "'turn_rewards' (one number per model call) and 'success'"
    )
    if isinstance(result, dict):
        unknown = set(result) - {"reward", "turn_rewards", "success"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}: {allowed}")
        reward = result.get("reward", 0.0)
        per_turn = result.get("turn_rewards")
        success = result.get("success")
    else:
        reward, per_turn, success = result, None, None
    if not _is_number(reward):
        raise ValueError(f"reward {reward!r} is not a finite number: {allowed}")
    if per_turn is None:
        rewards = [0.0] * turns
    else:
        if not isinstance(per_turn, list | tuple) or not all(_is_number(r) for r in per_turn):
            raise ValueError(f"turn_rewards must be a list of finite numbers: {allowed}")
        if len(per_turn) != turns:
            raise ValueError(f"{len(per_turn)} turn_rewards for {turns} model calls: {allowed}")
        rewards = [float(r) for r in per_turn]
    rewards[-1] += float(reward)
    for value in (reward, *rewards, sum(rewards)):
        if abs(float(value)) > max_abs:
            raise RewardOutOfBounds(
                f"reward {float(value):g} is beyond agent_max_abs_reward={max_abs:g}"
            )
    if success is None:
        success = sum(rewards) > 0
    elif not isinstance(success, bool | np.bool_):
        raise ValueError(f"success {success!r} is not a bool: {allowed}")
    return rewards, bool(success)


def _is_number(value: Any) -> bool:
    """A finite real number (numpy's included, bools not)."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool | np.bool_):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


#: what :func:`ended_by` counts, per batch
COUNTS = (
    "agent_errors",
    "agent_timeouts",
    "agent_no_model_call",
    "context_overflows",
    "engine_failures",
    "rewards_refused",
)


def ended_by(
    traj: Trajectory,
    call: Any,
    requests: int,
    limit: float,
    max_abs: float = float("inf"),
    engine_failures: int = 0,
) -> str:
    """End ``traj`` from its agent call: its rewards, or the failure; what to count.
    ``engine_failures``: the key's requests the engine failed (503): an agent that
    raised after one is counted as an engine failure, not an agent error."""
    traj.done = True
    overflowed = traj.end_reason == "context_overflow"  # the gateway refused a prompt
    if overflowed and not traj.turn_spans:
        failed(traj, "agent: its first prompt leaves no room for an answer in max_context_tokens")
        traj.end_reason = "context_overflow"  # unplayable: its group is dropped
        return "context_overflows"
    if call.is_alive():
        failed(traj, f"agent: no return within agent_timeout_s={limit:g}")
        return "agent_timeouts"
    if overflowed:  # the turns before the overflow stand; the agent's reward if it gave one
        traj.turn_rewards = [0.0] * len(traj.turn_spans)
        if call.error is None:
            traj.turn_rewards, traj.success = agent_outcome(
                call.result, len(traj.turn_spans), max_abs
            )
        return "context_overflows"
    if call.error is not None:
        if engine_failures:
            failed(traj, f"agent raised {call.error} after {engine_failures} engine failure(s)")
            return "engine_failures"
        failed(traj, f"agent raised {call.error}")
        return "agent_errors"
    if requests == 0 or not traj.turn_spans:
        failed(traj, "agent: returned without a chat completions request answered")
        return "agent_no_model_call"
    try:
        traj.turn_rewards, traj.success = agent_outcome(call.result, len(traj.turn_spans), max_abs)
    except ValueError as err:
        failed(traj, f"agent returned {_shown(call.result)}: {err}")
        return "rewards_refused" if isinstance(err, RewardOutOfBounds) else "agent_errors"
    traj.end_reason = "terminated"
    return "ok"


def _shown(value: Any) -> str:
    try:
        return repr(value)[:200]
    except Exception:  # noqa: BLE001 - a user object whose repr fails
        return f"a {type(value).__name__}"


def failed(traj: Trajectory, why: str) -> None:
    logger.warning("agent trajectory (seed %d): %s; its group is dropped", traj.seed, why)
    traj.turn_rewards = [0.0] * len(traj.turn_spans)
    traj.error, traj.success, traj.end_reason = why, False, "env_error"
