"""A control env with a known answer: Sokoban in one fixed room.

Every episode starts in the 6x6 room that ``SokobanEnv`` draws for seed 3:
one box, solved in 5 moves with 3 pushes, one of which needs the player to
walk round the box first (Up, Up, Right, Up, Left). A policy only has to learn
one move sequence, so a working multi-turn pipeline must take it to about 100%
quickly; the random-room example (``sokoban_cpu.yaml``, where the planner
solves about 95% and random play about 10%) can then be judged against it.
Importing this module registers ``FixedSokoban-v0``. The control as measured
(docs/results.md), with the example's levers off (one move a turn, the think
text generated, no shaping, every batch updating):

    PYTHONPATH=bench python bench/bench_train_cpu.py \\
        tuned_examples/sokoban_cpu.yaml --iterations 200 --threads 1 \\
        --config '{"env": "FixedSokoban-v0", "env_module": "fixed_sokoban",
                   "eval_num_states": 64, "eval_suites": null, "prefill": "<think>",
                   "skip_zero_advantage_updates": false, "env_config": {
                   "instructions": "compact", "coordinates": true,
                   "max_actions_per_turn": 1}}'
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from ragen_envs.grids.sokoban import SokobanEnv, SokobanState

ROOM_SEED = 3


def fixed_room(**kwargs: Any) -> SokobanState:
    """The room of the control: what ``SokobanEnv(**kwargs)`` draws for ``ROOM_SEED``."""
    env = SokobanEnv(**kwargs)
    env.reset(seed=ROOM_SEED)
    return env.state()


class FixedSokoban(SokobanEnv):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._room = fixed_room(dim_room=self.dim_room, num_boxes=self.num_boxes)

    def _draw_room(self) -> SokobanState:
        return self._room


if "FixedSokoban-v0" not in gym.registry:
    gym.register("FixedSokoban-v0", entry_point=FixedSokoban)
