"""Self-play: one policy plays both seats of a two-player game, each seat's turns its
own trajectory.

With ``self_play: true`` the env is a two-player game (``ragen/TicTacToe-v0``,
``ragen/KuhnPoker-v0``, or any env whose unwrapped class offers the same
self-play interface as :class:`ragen_envs.games.VersusEnv`: ``self_play``,
``seat_choice``, ``join``, ``waiting``, ``observe`` and ``settle``). In each
group the rollouts pair up: rollout 2k plays seat 0 and 2k+1 seat 1 of one game
(so a group of N holds N/2 games from its seed, both seats of each). The seat
is in the instructions, so one policy plays both, conditioned by the prompt.

Each round, every rollout whose seat is to move answers, all in one engine
batch (games of a batch are at different moves, and the two seats of the batch
are in the same calls). A seat's next prompt is put in when it is to move
again, so it shows the other seat's answer. When a move ends the game, the
other seat's trajectory ends too, its payoff added to its last turn's reward
(zero-sum); when one seat's trajectory ends without the game ending (its turn
limit, a context overflow, an env error), the other's ends as ``truncated``.
"""

from __future__ import annotations

from typing import Any

from ragen_rllib.env_runner.rollout_state import Rollout, finite_reward
from ragen_rllib.env_runner.turns import Turns

#: what a self-play env's unwrapped class must offer
INTERFACE = ("self_play", "seat_choice", "join", "waiting", "observe", "settle")


def is_self_play(envs: list[Any]) -> bool:
    """Whether the batch's envs are self-play games (a self-play run's evaluation
    against a fixed opponent plays one-agent envs)."""
    return bool(envs) and all(getattr(e.unwrapped, "self_play", False) for e in envs)


def seat_envs(envs: list[Any], groups: list[int]) -> None:
    """Pair the batch's envs: in each group, env 2k takes seat 0 of a new game and env
    2k+1 seat 1 of the same game."""
    sizes: dict[int, int] = {}
    for group in groups:
        sizes[group] = sizes.get(group, 0) + 1
    odd = {g: n for g, n in sizes.items() if n % 2}
    if odd:
        raise ValueError(
            f"self_play: groups of an odd number of rollouts ({odd}): a game needs both seats"
        )
    if any(b != a for a, b in zip(groups[::2], groups[1::2], strict=True)):
        raise ValueError("self_play: a group's rollouts must be next to each other")
    position: dict[int, int] = {}
    for i, (env, group) in enumerate(zip(envs, groups, strict=True)):
        inner = env.unwrapped
        present = dir(inner)  # without evaluating properties (the game may not be reset)
        missing = [name for name in INTERFACE if name not in present]
        if missing or not inner.self_play:
            raise ValueError(
                f"self_play: the env {type(inner).__name__} is no self-play game (missing "
                f"{missing or ['opponent: self']})"
            )
        k = position[group] = position.get(group, -1) + 1
        inner.seat_choice = k % 2
        if k % 2:
            inner.join(envs[i - 1].unwrapped)
        else:
            inner.own_game()


def play_games(
    turns: Turns,
    rollouts: list[Rollout],
    generate,
    options: dict,
    max_new_tokens: int,
) -> int:
    """Play the paired rollouts to their end; ``generate(prompts, keys, round, policy)``
    is one engine call (``policy``: a rollout's, None for the trained policy).
    Returns the tokens generated."""
    first_ids: dict = {}
    partner = {id(r): rollouts[i + (1 if i % 2 == 0 else -1)] for i, r in enumerate(rollouts)}
    pending = [r for i, r in enumerate(rollouts) if i % 2]  # seat 1: begun at its first move
    active = []
    for r in (r for i, r in enumerate(rollouts) if i % 2 == 0):  # seat 0 resets the game
        turns.begin(r, options, first_ids, max_new_tokens)
        if r.context is None:  # its game cannot be played: nor can the other seat
            pending.remove(partner[id(r)])
            partner[id(r)].unplayable("env_error", "its game's other seat could not start")
        else:
            active.append(r)
    deferred: dict[int, tuple] = {}  # rollout -> (answer, turn, obs, reward, info) to follow
    last_answer: dict[int, Any] = {}
    generated, rounds = 0, 0
    while active or pending:
        started = [r for r in pending if not r.env.unwrapped.waiting]
        for r in started:
            pending.remove(r)
            turns.begin(r, options, first_ids, max_new_tokens)
            if r.context is not None:
                active.append(r)
        ready = _to_move(turns, active, deferred, max_new_tokens)
        if ready:
            rounds += 1
            gens = _answers(ready, generate, rounds)
            for r in ready:
                gen = last_answer[id(r)] = gens[id(r)]
                generated += len(gen.ids)
                turn = len(r.traj.turn_rewards) + 1
                step = turns.take(r, gen, turn)
                if step is not None:
                    deferred[id(r)] = (gen, turn, *step)
        _settle(active + pending, partner, last_answer)
        active = [r for r in active if not r.traj.done]
        pending = [r for r in pending if not r.traj.done]
        if (active or pending) and not ready and not started:  # no seat can move
            for r in active + pending:  # an env that names no agent to move, say
                r.unplayable("env_error", "neither seat is to move in a game that goes on")
            break
    return generated


def _to_move(turns: Turns, active: list[Rollout], deferred: dict, max_new_tokens: int) -> list:
    """The rollouts whose seat is to move this round, each with its next prompt put in
    (the observation after the other seat's move) where its last turn left one due."""
    ready = []
    for r in active:
        if r.traj.done or r.env.unwrapped.waiting:
            continue
        if id(r) in deferred:
            gen, turn, _, reward, info = deferred.pop(id(r))
            obs = r.env.unwrapped.observe()  # after the other seat's move
            if not turns.follow(r, gen, turn, obs, reward, info, max_new_tokens):
                continue
        ready.append(r)
    return ready


def _answers(ready: list[Rollout], generate, round_: int) -> dict[int, Any]:
    """One engine call per policy playing this round (opponents have engines of their
    own): each ready rollout's answer, by ``id(rollout)``."""
    by_policy: dict[str | None, list[Rollout]] = {}
    for r in ready:
        by_policy.setdefault(r.policy, []).append(r)
    gens = {}
    for policy, batch in by_policy.items():
        prompts, keys = [r.context.prompt for r in batch], [id(r) for r in batch]
        gens.update(zip(keys, generate(prompts, keys, round_, policy), strict=True))
    return gens


def _settle(rollouts: list[Rollout], partner: dict, last_answer: dict) -> None:
    """End the trajectories whose game ended on the other seat's move (their payoff
    added to their last turn), or whose other seat's trajectory ended first."""
    for r in rollouts:
        if r.traj.done:
            continue
        inner, other = r.env.unwrapped, partner[id(r)]
        gen = last_answer.get(id(r))
        if gen is None:  # it never moved (its env may not even be reset for this game)
            if other.traj.done:  # nothing of it to train
                r.unplayable("env_error", "its game's other seat ended before its first move")
            continue
        try:
            payoff = inner.settle()
            payoff = None if payoff is None else finite_reward(payoff)
        except Exception as err:  # noqa: BLE001 - a user's game must not kill the batch
            r.unplayable("env_error", f"settle(): {type(err).__name__}: {err}")
            continue
        if payoff is not None:
            r.traj.turn_rewards[-1] += payoff
            r.traj.turn_infos[-1] = {**r.traj.turn_infos[-1], **inner.result_info()}
            r.traj.success = payoff > 0
            r.finish(gen.ended_with_eos, "terminated")
        elif other.traj.done:  # cut (turn limit, overflow, env error) or the env left it
            r.finish(gen.ended_with_eos, "truncated")
