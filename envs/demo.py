"""Play every environment with a planning agent and a random agent and print success rates.

A quick way to see the environments work end to end, through the same text
interface a language model uses: each agent writes answers such as
``<think>...</think><answer>Up || Left</answer>``, or, for the free-text envs,
an expression, placements, a number or a search command. The random agent of a
free-text env writes random well-formed answers of that env's kind.

    python -m ragen_envs.demo --episodes 100
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np

from . import ENV_IDS
from .core.base import TextEnv
from .games.players import REFERENCE, player_of
from .games.versus import VersusEnv
from .grids.frozenlake import FrozenLakeEnv, shortest_path
from .grids.game2048 import Game2048Env, plan_moves
from .grids.sokoban import SokobanEnv
from .grids.sokoban_solver import solve
from .puzzles.bandit import BanditEnv
from .puzzles.countdown import CountdownEnv
from .puzzles.countdown_expr import solve as solve_countdown
from .puzzles.sudoku import SudokuEnv
from .puzzles.sudoku_solver import solve as solve_sudoku
from .qa.dataset_qa import DatasetQAEnv
from .qa.search_qa import SearchQAEnv, oracle_command

Agent = Callable[[TextEnv, np.random.Generator], list[str]]


def _answer(actions: list[str], separator: str) -> str:
    return f"<think>planned</think><answer>{f' {separator} '.join(actions)}</answer>"


def planner(env: TextEnv, rng: np.random.Generator) -> list[str]:
    """The next turn's actions from a planner: exact (BFS, best mean arm, search, the
    Sudoku solver, the gold answer, the search oracle, minimax, Kuhn Poker's
    equilibrium) or, for 2048, a heuristic."""
    if isinstance(env, BanditEnv):
        return [max(env.arms, key=lambda a: a.mean).name]
    if isinstance(env, FrozenLakeEnv):
        # Replan after every move: on a slippery lake the state drifts from the plan.
        path = shortest_path(env.holes, env.player, env.goal) or ["Up"]
        return path[:1] if env.is_slippery else path[: env.parser.max_actions]
    if isinstance(env, SokobanEnv):
        path = solve(env.state()) or ["Up"]
        return path[: env.parser.max_actions]
    if isinstance(env, CountdownEnv):
        return [solve_countdown(env.numbers, env.target) or str(env.numbers[0])]
    if isinstance(env, SudokuEnv):
        givens = [v if given else 0 for v, given in zip(env.grid, env.givens, strict=True)]
        solution = solve_sudoku(givens, env.box) or givens
        todo = [i for i, v in enumerate(env.grid) if v != solution[i]]
        n = env.size
        return [f"r{i // n + 1}c{i % n + 1}={solution[i]}" for i in todo[: env.parser.max_actions]]
    if isinstance(env, Game2048Env):  # a heuristic: the turn's new tiles are not seen
        return plan_moves(env.board, env.size, env.parser.max_actions, rng)
    if isinstance(env, DatasetQAEnv):  # the gold answer
        return [env.gold]
    if isinstance(env, SearchQAEnv):  # searches the question's chain of passages by title
        return [oracle_command(env)]
    if isinstance(env, VersusEnv):  # the game's reference player: minimax, Nash, trader
        best = REFERENCE[type(env.game)]
        return [player_of(env.game, best)(env.game, rng)]
    raise TypeError(f"no planner for {type(env).__name__}")


def random_agent(env: TextEnv, rng: np.random.Generator) -> list[str]:
    """Random valid actions, or for a free-text env a random well-formed answer."""
    return env.random_actions(rng)


def play(env_id: str, agent: Agent, episodes: int, max_turns: int) -> dict[str, float]:
    env = gym.make(env_id)
    inner: TextEnv = env.unwrapped
    rng = np.random.default_rng(0)
    successes, returns, turns = [], [], []
    for seed in range(episodes):
        env.reset(seed=seed)
        total, info, played = 0.0, {"success": False}, 0
        while played < max_turns:
            answer = _answer(agent(inner, rng), inner.parser.separator)
            _, reward, term, trunc, info = env.step(answer)
            total += reward
            played += 1
            if term or trunc:
                break
        successes.append(info["success"])
        returns.append(total)
        turns.append(played)
    return {
        "success": float(np.mean(successes)),
        "return": float(np.mean(returns)),
        "turns": float(np.mean(turns)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--max-turns", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"{'env':<32} {'agent':<8} {'success':>8} {'return':>8} {'turns':>6} {'s':>6}")
    for env_id in ENV_IDS:
        for name, agent in (("planner", planner), ("random", random_agent)):
            start = time.perf_counter()
            stats = play(env_id, agent, args.episodes, args.max_turns)
            print(
                f"{env_id:<32} {name:<8} {stats['success']:>8.2%} {stats['return']:>8.2f} "
                f"{stats['turns']:>6.1f} {time.perf_counter() - start:>6.1f}"
            )


if __name__ == "__main__":
    main()
