"""A control env with a known answer: FrozenLakeNoSlip on one fixed map.

Every episode starts on the map (holes, start and goal) that
``generate_lake`` draws from ``numpy.random.default_rng(3)``: a 4-move
shortest path past 2 holes. A policy only has to learn one path, so a working
multi-turn pipeline must take it to about 100% quickly; the random-map
examples can then be judged against it. Importing this module registers
``FixedLake-v0``:

    PYTHONPATH=bench python bench/bench_train_cpu.py \\
        tuned_examples/frozenlake_noslip_cpu.yaml --minutes 6 --threads 1 \\
        --config '{"env": "FixedLake-v0", "env_module": "fixed_lake", "eval_num_states": 64}'
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from ragen_envs.grids.frozenlake import FrozenLakeEnv, generate_lake

MAP_SEED = 3


class FixedLake(FrozenLakeEnv):
    def _new_episode(self) -> None:
        rng = np.random.default_rng(MAP_SEED)
        self.holes, self.start, self.goal = generate_lake(rng, self.size, self.p_frozen)
        self.player = self.start
        self._moves_this_turn = []


if "FixedLake-v0" not in gym.registry:
    gym.register("FixedLake-v0", entry_point=FixedLake, kwargs={"is_slippery": False})
