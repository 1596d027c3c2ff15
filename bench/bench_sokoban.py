"""Time Sokoban room generation per preset, and report how hard the rooms are.

Generation runs inside ``reset()``, so a room's time is one ``env.reset(seed)``
(its rendering included). The shortest solution length, from the BFS solver
outside the timed part, shows what the rooms ask of an agent.

    python bench/bench_sokoban.py --rooms 200
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.grids.sokoban_solver import solve

PRESETS = ("ragen/SimpleSokoban-v0", "ragen/LargeSokoban-v0", "ragen/SokobanNewVocab-v0")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rooms", type=int, default=200, help="rooms per preset (seeds 0..N-1)")
    args = parser.parse_args(argv)
    if args.rooms < 1:
        parser.error("--rooms must be >= 1")
    print(
        f"{'preset':<28} {'rooms':>6} {'median ms':>10} {'p90 ms':>8} {'solution median/max':>20}"
    )
    for env_id in PRESETS:
        env = gym.make(env_id).unwrapped
        times, lengths = [], []
        for seed in range(args.rooms):
            start = time.perf_counter()
            env.reset(seed=seed)
            times.append(time.perf_counter() - start)
            lengths.append(len(solve(env.state())))
        ms = np.array(times) * 1e3
        solution = f"{np.median(lengths):.0f}/{max(lengths)}"
        print(
            f"{env_id:<28} {args.rooms:>6} {np.median(ms):>10.2f} {np.percentile(ms, 90):>8.2f} "
            f"{solution:>20}"
        )


if __name__ == "__main__":
    main()
