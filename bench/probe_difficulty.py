"""How hard the evaluation states of the grid examples are, and what a reactive rule gets.

For FrozenLakeNoSlip and SimpleSokoban (6x6, one box), on the evaluation states
(``env.reset(seed=i)`` for i < ``--states``, as ``eval_seed: 0`` draws them):
the share of states whose shortest solution takes 1, 2, ... moves, and the
success within 10 moves of two agents that see only the current state:

* FrozenLakeNoSlip, "greedy": step to a neighbouring frozen tile (never a hole,
  never off the lake) that is closest to the goal by Manhattan distance, ties
  broken at random. It needs no lookahead, so it is the kind of rule a
  one-move-a-turn policy with a context window of 0 can represent.
* Sokoban, "one-push": walk to the cell behind the box and push it along the
  row or column towards the target, re-planning after each move, with no
  lookahead over walls. (The planner, not shown, solves about 95%.)

    python bench/probe_difficulty.py --states 256
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from ragen_envs.grids.frozenlake import MOVES, FrozenLakeEnv, shortest_path
from ragen_envs.grids.sokoban import SokobanEnv
from ragen_envs.grids.sokoban_solver import solve

BUDGET = 10


def lake_greedy(env: FrozenLakeEnv, rng: np.random.Generator) -> bool:
    player = env.player
    goal = env.goal
    for _ in range(BUDGET):
        options = []
        for dr, dc in MOVES.values():
            cell = (player[0] + dr, player[1] + dc)
            if 0 <= cell[0] < env.size and 0 <= cell[1] < env.size and not env.holes[cell]:
                options.append((abs(cell[0] - goal[0]) + abs(cell[1] - goal[1]), cell))
        best = min(d for d, _ in options)
        ties = [cell for d, cell in options if d == best]
        player = ties[int(rng.integers(len(ties)))]
        if player == goal:
            return True
    return False


def sokoban_one_push(env: SokobanEnv) -> bool:
    room = env.state()
    (box,), (target,) = tuple(room.boxes), tuple(room.targets)
    player, moves = room.player, 0
    walls = np.zeros(room.shape, dtype=bool)
    for cell in room.walls:
        walls[cell] = True
    while moves < BUDGET and box != target:
        dr = (target[0] > box[0]) - (target[0] < box[0])
        dc = 0 if dr else (target[1] > box[1]) - (target[1] < box[1])
        behind = (box[0] - dr, box[1] - dc)
        if player != behind:
            blocked = walls.copy()
            blocked[box] = True
            walk = shortest_path(blocked, player, behind)  # the moves, or None
            if walk is None:
                return False
            moves += len(walk)
            player = behind
            continue
        ahead = (box[0] + dr, box[1] + dc)
        if walls[ahead]:
            return False
        player, box, moves = box, ahead, moves + 1
    return box == target and moves <= BUDGET


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--states", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)

    lake = FrozenLakeEnv(is_slippery=False)
    lengths, greedy = Counter(), 0
    for seed in range(args.states):
        lake.reset(seed=seed)
        lengths[len(shortest_path(lake.holes, lake.start, lake.goal))] += 1
        greedy += lake_greedy(lake, rng)
    print_row("FrozenLakeNoSlip", lengths, args.states, "greedy", greedy)

    soko = SokobanEnv()
    lengths, pushes = Counter(), 0
    for seed in range(args.states):
        soko.reset(seed=seed)
        path = solve(soko.state())
        lengths[len(path) if path is not None else -1] += 1
        pushes += sokoban_one_push(soko)
    print_row("SimpleSokoban", lengths, args.states, "one-push", pushes)


def print_row(name: str, lengths: Counter, n: int, agent: str, wins: int) -> None:
    shares = ", ".join(f"{k}: {100 * v / n:.1f}%" for k, v in sorted(lengths.items()))
    print(f"{name}: shortest solution (moves) {shares}")
    within = sum(v for k, v in lengths.items() if 0 <= k <= BUDGET)
    print(
        f"  solvable in {BUDGET} moves {100 * within / n:.1f}%; {agent} agent {100 * wins / n:.1f}%"
    )


if __name__ == "__main__":
    main()
