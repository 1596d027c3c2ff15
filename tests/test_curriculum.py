"""The curriculum: reset options for the training envs by iteration.

SokobanEnv's solution-length options, the ``curriculum`` setting's checks (each
naming the key), and a short run in which the first stage's rooms are the easy
ones, the stage changes on schedule, and evaluation still sees every room.
"""

from __future__ import annotations

import pytest
from conftest import run_script, tiny_dict

from ragen_envs.grids.sokoban import SokobanEnv, parse_room
from ragen_envs.grids.sokoban_solver import solve
from ragen_rllib.env_runner.curriculum import parse_curriculum, stage_at


def solution_length(observation: str) -> int:
    return len(solve(parse_room(observation)))


def test_sokoban_draws_rooms_within_the_solution_length_range():
    env = SokobanEnv()
    easy = [
        solution_length(env.reset(seed=s, options={"max_solution_length": 3})[0]) for s in range(40)
    ]
    hard = [
        solution_length(env.reset(seed=s, options={"min_solution_length": 6})[0]) for s in range(40)
    ]
    plain = [solution_length(env.reset(seed=s)[0]) for s in range(40)]
    assert max(easy) <= 3 and min(hard) >= 6
    assert min(plain) <= 3 < 6 <= max(plain)  # without options: the whole range
    # Deterministic per seed and options, and no options leave the seed's room as it was.
    again = SokobanEnv()
    assert env.reset(seed=7, options={"max_solution_length": 3}) == again.reset(
        seed=7, options={"max_solution_length": 3}
    )
    assert env.reset(seed=7)[0] == SokobanEnv().reset(seed=7)[0]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"max_solution_length": 0}, "max_solution_length must be null or an int >= 1"),
        ({"min_solution_length": 2.5}, "min_solution_length must be null or an int >= 1"),
        ({"min_solution_length": 5, "max_solution_length": 3}, "5 > max_solution_length 3"),
        ({"depth": 3}, "unknown reset options \\['depth'\\]"),
    ],
)
def test_bad_solution_length_options(options, match):
    with pytest.raises(ValueError, match=match):
        SokobanEnv().reset(seed=0, options=options)


def test_a_range_no_room_meets_names_itself():
    with pytest.raises(RuntimeError, match="shortest solution of 40..None moves"):
        SokobanEnv().reset(seed=0, options={"min_solution_length": 40})


def test_stage_at_follows_the_schedule():
    stages = parse_curriculum(
        [
            {"from_iteration": 0, "reset_options": {"max_solution_length": 2}},
            {"from_iteration": 5, "reset_options": {}},
        ]
    )
    assert stage_at(stages, 0) == (0, {"max_solution_length": 2})
    assert stage_at(stages, 4) == (0, {"max_solution_length": 2})
    assert stage_at(stages, 5) == (1, None)  # a stage without options resets plainly
    assert stage_at([], 3) == (-1, None)


STAGE = {"from_iteration": 0, "reset_options": {"max_solution_length": 3}}


@pytest.mark.parametrize(
    "curriculum, overrides, match",
    [
        ({"from_iteration": 0}, {}, "curriculum=.*null or a list of stages"),
        (
            [{"from_iteration": 0}],
            {},
            "curriculum\\[0\\].*exactly from_iteration and reset_options",
        ),
        ([{**STAGE, "from_iteration": 3}], {}, "curriculum\\[0\\].*must start at from_iteration 0"),
        ([STAGE, STAGE], {}, "curriculum\\[1\\].*must increase"),
        ([{**STAGE, "from_iteration": -1}], {}, "curriculum\\[0\\].*an int >= 0"),
        (
            [{**STAGE, "reset_options": [3]}],
            {},
            "curriculum\\[0\\].*reset_options must be a mapping",
        ),
        (
            [{"from_iteration": 0, "reset_options": {"max_solution_length": 0}}],
            {},
            "curriculum\\[0\\]: the env 'ragen/SimpleSokoban-v0' rejects reset_options",
        ),
        (
            [STAGE],
            {"env": None, "env_mix": [{"env": "ragen/SimpleSokoban-v0", "groups": 2}]},
            "curriculum is invalid with env_mix",
        ),
    ],
)
def test_bad_curriculum_names_the_stage(curriculum, overrides, match):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    config = tiny_dict(curriculum=curriculum, **{"env": "ragen/SimpleSokoban-v0", **overrides})
    if config["env"] is None:
        del config["env"]
    with pytest.raises(ValueError, match=match):
        StarPOConfig.from_user_dict(config).check()


@pytest.mark.slow
def test_training_rooms_follow_the_schedule_and_evaluation_does_not(tmp_path):
    config = tiny_dict(
        env="ragen/SimpleSokoban-v0",
        env_groups=6,
        rollout_dump_interval=1,
        curriculum=[
            {"from_iteration": 0, "reset_options": {"max_solution_length": 2}},
            {"from_iteration": 2, "reset_options": {}},
        ],
        seed=3,
    )
    script = """
import json, pathlib, ray
import pyarrow.parquet as pq
from ragen_envs.grids.sokoban import parse_room
from ragen_envs.grids.sokoban_solver import solve
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(address="local", num_cpus=2, include_dashboard=False)
length = lambda obs: len(solve(parse_room(obs)))
algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
out = {"stages": [algo.train()["curriculum"]["stage"] for _ in range(3)], "train": {}}
for it in (1, 2, 3):
    path = pathlib.Path(algo.logdir) / "rollouts" / f"iter_{it:06d}.parquet"
    out["train"][it] = sorted({length(o) for o in pq.read_table(path)["observation"].to_pylist()})
_, trajs = algo.env_runner.evaluate(num_states=24, first_seed=0, temperature=0.5)
out["eval"] = sorted({length(t.turn_observations[0]) for t in trajs})
print(json.dumps(out))
"""
    out = run_script(script, tmp_path, define={"CONFIG": config})
    assert out["stages"] == [0, 0, 1]
    assert max(out["train"]["1"] + out["train"]["2"]) <= 2
    assert max(out["train"]["3"]) > 2  # the last stage: every room again
    assert max(out["eval"]) > 2  # evaluation never had the options
