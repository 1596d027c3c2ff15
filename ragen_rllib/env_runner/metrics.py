"""Per-iteration metrics computed from a batch of trajectories (no Ray).

The paper's collapse indicators are here: in-group reward std (falls before
success does; the sample std of :func:`~ragen_rllib.maths.filters.in_group_std`,
the same the rollout filter ranks groups by), response length, and the env's
validity/effectiveness rates. The env runner logs them for evaluation and the
algorithm for every training batch (under ``rollout/``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable

import numpy as np

from ragen_rllib.maths.filters import in_group_std
from ragen_rllib.maths.pass_at_k import mean_pass_at_k
from ragen_rllib.records.trajectory import Trajectory, env_name

ENV_INFO_KEYS = ("action_is_valid", "action_is_effective", "format_ok", "num_actions")


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Outcome statistics of a batch. Trajectories that hit an env error count only in
    ``env_errors`` and ``end/env_error`` (and those whose first prompt left no room,
    in ``end/context_overflow``): they have no outcome to average."""
    ended = Counter(t.end_reason for t in trajs)
    env_errors = ended.get("env_error", 0)
    ends = {f"end/{reason}": n / len(trajs) for reason, n in ended.items()} if trajs else {}
    trajs = [t for t in trajs if not t.unplayable]
    if not trajs:
        return {"num_trajectories": 0, "env_errors": env_errors, **ends}
    rewards = np.array([t.total_reward for t in trajs])
    turn_lengths = [e - s for t in trajs for _, s, e in t.turn_spans]
    infos = [i for t in trajs for i in t.turn_infos]
    out = {
        "num_trajectories": len(trajs),
        "env_errors": env_errors,
        "success_rate": float(np.mean([t.success for t in trajs])),
        "reward_mean": float(rewards.mean()),
        # Over the whole batch (population std); the in-group one is the sample std.
        "batch_reward_std": float(rewards.std()),
        "in_group_reward_std": float(
            in_group_std([t.total_reward for t in trajs], [t.group for t in trajs]).mean()
        ),
        "num_turns_mean": float(np.mean([t.num_turns for t in trajs])),
        "response_length_mean": float(np.mean(turn_lengths)) if turn_lengths else 0.0,
        "trajectory_tokens_mean": float(np.mean([t.num_tokens for t in trajs])),
    }
    counts = [  # loss_tokens: answer (its reasoning's tokens, its answer's) per turn
        (n, e - s)
        for t in trajs
        if t.turn_reasoning_tokens
        for n, (_, s, e) in zip(t.turn_reasoning_tokens, t.turn_spans, strict=True)
    ]
    if counts:
        out["loss_tokens/reasoning_closed_share"] = float(np.mean([n > 0 for n, _ in counts]))
        out["loss_tokens/answer_token_share"] = 1.0 - sum(n for n, _ in counts) / max(
            sum(length for _, length in counts), 1
        )
    for key in ENV_INFO_KEYS:
        values = [float(i[key]) for i in infos if key in i]
        if values:
            out[f"env/{key}"] = float(np.mean(values))
    out.update(group_outcomes(trajs))
    out.update(game_outcomes(trajs))
    out.update(ends)
    return out


def game_outcomes(trajs: list[Trajectory]) -> dict[str, float]:
    """For two-player games (a last turn's info with ``outcome``): the shares of
    trajectories won, drawn, lost (the rest were cut unfinished), the mean payoff
    (unfinished: 0) and the mean payoff by seat (``info["seat"]``). {} otherwise."""
    last = [t.turn_infos[-1] for t in trajs if t.turn_infos and "outcome" in t.turn_infos[-1]]
    if not last:
        return {}
    outcomes = Counter(i["outcome"] for i in last)
    out = {
        f"game/{name}_rate": outcomes.get(name, 0) / len(last) for name in ("win", "draw", "loss")
    }
    out["game/payoff_mean"] = float(np.mean([i.get("payoff") or 0.0 for i in last]))
    for seat, infos in _by_seat(last).items():
        out[f"game/payoff_mean_seat{seat}"] = float(
            np.mean([i.get("payoff") or 0.0 for i in infos])
        )
    return out


def _by_seat(infos: list[dict]) -> dict[int, list[dict]]:
    """The infos by their `seat` (in seat order)."""
    out: dict = {}
    for info in infos:
        if isinstance(info.get("seat"), int):
            out.setdefault(info["seat"], []).append(info)
    return dict(sorted(out.items()))


def group_outcomes(trajs: list[Trajectory]) -> dict[str, float]:
    """Shares of the groups (of two or more trajectories) whose rollouts all
    succeeded, all failed or were mixed, and whose rollouts wrote the very same
    answers turn by turn (``groups_same_answers``). Only mixed groups rank
    success against failure; an all-failed group with the same answers is, on a
    deterministic env, one the policy fails on deterministically, which no group-relative advantage
    can reach. {} when no group has two trajectories."""
    sized = [g for g in split_by(trajs, lambda t: t.group).values() if len(g) > 1]
    if not sized:
        return {}
    wins = [sum(bool(t.success) for t in g) / len(g) for g in sized]  # share won
    n = len(sized)
    return {
        "groups_all_success": sum(w == 1 for w in wins) / n,
        "groups_all_fail": sum(w == 0 for w in wins) / n,
        "groups_mixed": sum(0 < w < 1 for w in wins) / n,
        "groups_same_answers": sum(len({tuple(t.answers) for t in g}) == 1 for g in sized) / n,
    }


def evaluation_metrics(trajs: list[Trajectory], pass_k: tuple[int, ...]) -> dict[str, float]:
    """:func:`rollout_metrics` of an evaluation, whose groups are its states (each
    played ``n`` times), plus ``pass@k`` for each k in ``pass_k`` (k <= n; a
    trajectory ended by an env error counts as a failure there) and
    ``format_valid_rate``, the share of turns whose answer had the required format
    (for envs that report ``format_ok``)."""
    out = rollout_metrics(trajs)
    wins = [
        [bool(t.success) and t.end_reason != "env_error" for t in state]
        for state in split_by(trajs, lambda t: t.group).values()
    ]
    for k in pass_k:
        out[f"pass@{k}"] = mean_pass_at_k(wins, k)
    if "env/format_ok" in out:
        out["format_valid_rate"] = out["env/format_ok"]
    return out


def split_by(trajs: list[Trajectory], key: Callable[[Trajectory], Hashable]) -> dict:
    """{key: its trajectories}, in the order the keys first appear."""
    out: dict[Hashable, list[Trajectory]] = {}
    for t in trajs:
        out.setdefault(key(t), []).append(t)
    return out


def by_env(trajs: list[Trajectory]) -> dict[str, list[Trajectory]]:
    """A mixture's batch split by env (in the order the envs first appear)."""
    return split_by(trajs, env_name)


def mean_over_envs(per_env: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each metric that every env reports, averaged over the envs (each env weighs
    the same, whatever its number of states)."""
    shared = set.intersection(*(set(m) for m in per_env.values())) if per_env else set()
    return {
        key: float(np.mean([m[key] for m in per_env.values()]))
        for key in sorted(shared)
        if all(isinstance(m[key], int | float) for m in per_env.values())
    }
