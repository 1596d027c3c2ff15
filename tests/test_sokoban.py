"""Sokoban: every generated room solvable and replayable, rules, rewards, budgets, vocabularies."""

from __future__ import annotations

import numpy as np
import pytest

from ragen_envs.grids import sokoban_gen
from ragen_envs.grids.sokoban import VOCABS, SokobanEnv, parse_room, render_room
from ragen_envs.grids.sokoban_solver import SolverLimitError, solve

PRESETS = {
    "SimpleSokoban": {"dim_room": (6, 6), "num_boxes": 1},
    "LargeSokoban": {"dim_room": (8, 8), "num_boxes": 2},
    "SokobanNewVocab": {"dim_room": (6, 6), "num_boxes": 1, "vocab": "new"},
}
STANDARD_SYMBOLS = "#_OX√PS"
UNLIMITED = {"action_budget": 10**6, "max_steps": 10**6}

# Two boxes, so a single push onto a target does not end the episode.
TWO_BOXES = """
######
#PXO_#
#____#
#_X__#
#___O#
######
"""
ONE_PUSH_TO_WIN = """
######
#PXO_#
#____#
#____#
#____#
######
"""
# Player on a target, box on a target, boxes, a target: every symbol but the plain player.
ALL_SYMBOLS = """
######
#S√__#
#_X__#
#_X__#
#___O#
######
"""


def answer(*actions: str) -> str:
    return f"<think>x</think><answer>{' || '.join(actions)}</answer>"


def env_in(room: str, **kwargs) -> tuple[SokobanEnv, str]:
    env = SokobanEnv(**kwargs)
    obs, _ = env.reset(seed=0, options={"room": room})
    return env, obs


@pytest.mark.parametrize("preset", PRESETS)
def test_every_generated_room_is_solved_by_replaying_the_solver(preset):
    env = SokobanEnv(**PRESETS[preset], **UNLIMITED)
    for seed in range(1000):
        env.reset(seed=seed)
        path = solve(env.state())
        assert path, (seed, env.render())  # solvable and not already solved
        terminated = False
        for start in range(0, len(path), 5):
            assert not terminated
            _, reward, terminated, truncated, info = env.step(answer(*path[start : start + 5]))
            assert info["action_is_valid"] and not truncated
        # At most 5 actions of -0.1 and +1 each cannot exceed 5: only the +10 can.
        assert terminated and info["success"] and reward > 5, (seed, path)


def test_push_onto_and_off_a_target():
    env, obs = env_in(TWO_BOXES)
    assert obs == TWO_BOXES.strip()
    obs, r, term, _, info = env.step(answer("Right"))
    assert r == pytest.approx(-0.1 + 1) and not term and info["boxes_on_target"] == 1
    assert obs.split("\n")[1] == "#_P√_#"
    obs, r, term, _, info = env.step(answer("Right"))
    assert r == pytest.approx(-0.1 - 1) and not term and info["boxes_on_target"] == 0
    assert obs.split("\n")[1] == "#__SX#" and info["action_is_effective"]


def test_solving_gives_10_and_terminates_before_the_rest_of_the_turn():
    env, _ = env_in(ONE_PUSH_TO_WIN)
    obs, r, term, trunc, info = env.step(answer("Right", "Down", "Down"))
    assert r == pytest.approx(-0.1 + 1 + 10) and term and not trunc
    assert info["success"] and info["num_actions"] == 1
    assert obs.split("\n")[1] == "#_P√_#"
    with pytest.raises(RuntimeError, match="reset"):
        env.step(answer("Left"))


def test_distance_shaping_pays_each_push_by_the_distance_it_removes():
    room = "######\n#P___#\n#_X__#\n#____#\n#_O__#\n######"  # the box 2 cells above O
    env, _ = env_in(room, distance_shaping=0.5)
    assert env.step(answer("Down", "Left"))[1] == pytest.approx(-0.2)  # no push: no shaping
    env, _ = env_in(room, distance_shaping=0.5)
    _, r_walk, *_ = env.step(answer("Right"))
    _, r_down, *_ = env.step(answer("Down"))  # pushes the box from (2,2) to (3,2): 1 nearer
    assert r_walk == pytest.approx(-0.1) and r_down == pytest.approx(-0.1 + 0.5)
    _, r_push, term, _, info = env.step(answer("Down"))  # onto the target: shaping + 1 + 10
    assert term and info["success"] and r_push == pytest.approx(-0.1 + 0.5 + 1 + 10)
    # Away from the target costs as much; 0 (the default) gives the paper's rewards.
    env, _ = env_in(room, distance_shaping=0.5)
    env.step(answer("Right"))
    assert env.step(answer("Down", "Up"))[1] == pytest.approx(-0.2 + 0.5)  # push, step back
    env, _ = env_in(room, distance_shaping=0.5)
    env.step(answer("Down"))
    assert env.step(answer("Right"))[1] == pytest.approx(-0.1 - 0.5)  # box to (2,3): farther
    env, _ = env_in(room)
    env.step(answer("Right"))
    assert env.step(answer("Down"))[1] == pytest.approx(-0.1)


def test_distance_shaping_sums_to_the_potential_drop_with_two_boxes():
    """Over random moves in two-box rooms, shaped minus plain rewards add up to c times
    the drop of sum-over-boxes(distance to the nearest target): a potential difference."""

    def potential(env: SokobanEnv) -> int:
        state = env.state()
        return sum(min(abs(b[0] - t[0]) + abs(b[1] - t[1]) for t in state.targets)
                   for b in state.boxes)  # fmt: skip

    rng = np.random.default_rng(0)
    checked = 0
    for seed in range(20):
        shaped = SokobanEnv(**PRESETS["LargeSokoban"], **UNLIMITED, distance_shaping=0.5)
        plain = SokobanEnv(**PRESETS["LargeSokoban"], **UNLIMITED)
        shaped.reset(seed=seed)
        plain.reset(seed=seed)
        start, extra = potential(shaped), 0.0
        for move in rng.choice(["Up", "Down", "Left", "Right"], size=40):
            _, r_shaped, term, *_ = shaped.step(answer(str(move)))
            _, r_plain, *_ = plain.step(answer(str(move)))
            extra += r_shaped - r_plain
            if term:
                break
        assert extra == pytest.approx(0.5 * (start - potential(shaped)))
        checked += start != potential(shaped)
    assert checked >= 5  # the boxes did move in several rooms


@pytest.mark.parametrize(
    "room, move",
    [
        ("######\n#_PX##\n#____#\n#____#\n#___O#\n######", "Right"),  # box into a wall
        ("######\n#PXX_#\n#__OO#\n#____#\n#____#\n######", "Right"),  # box into a box
        ("######\n#P_X_#\n#___O#\n#____#\n#____#\n######", "Up"),  # player into a wall
        ("P____\n_X___\n____O\n_____\n_____", "Left"),  # off an open grid edge
    ],
)
def test_blocked_moves_cost_a_step_and_change_nothing(room, move):
    env, before = env_in(room, dim_room=(len(room.split("\n")), len(room.split("\n")[0])))
    after, r, term, _, info = env.step(answer(move))
    assert after == before and r == pytest.approx(-0.1) and not term
    assert info["action_is_valid"] and not info["action_is_effective"]
    assert info["num_actions"] == 1 and info["num_effective_actions"] == 0


def test_invalid_action_name_costs_the_format_penalty_once_and_valid_ones_run():
    env, _ = env_in(TWO_BOXES)
    obs, r, _, _, info = env.step(answer("Down", "Jump", "Fly", "Right"))
    assert r == pytest.approx(2 * -0.1 - 0.1)
    assert info["format_penalty"] == pytest.approx(-0.1) and not info["action_is_valid"]
    assert info["executed_actions"] == ("Down", "Right") and info["num_invalid_actions"] == 2
    assert obs.split("\n")[2] == "#_P__#"
    _, r, _, _, info = env.step("no tags at all")
    assert r == pytest.approx(-0.1) and info["num_actions"] == 0 and not info["format_ok"]


def test_action_budget_of_10_truncates():
    env, obs = env_in(TWO_BOXES)
    _, _, term, trunc, info = env.step(answer("Down", "Up", "Down", "Up", "Down"))
    assert not (term or trunc) and info["actions_left"] == 5
    _, _, term, trunc, info = env.step(answer("Up", "Down", "Up", "Down", "Up"))
    assert trunc and not term and info["actions_left"] == 0 and info["num_actions"] == 5
    with pytest.raises(RuntimeError, match="reset"):
        env.step(answer("Down"))


def test_max_steps_truncates_even_mid_turn():
    env = SokobanEnv(max_steps=3, action_budget=10)
    _, info = env.reset(seed=0, options={"room": TWO_BOXES})
    assert info["actions_left"] == 3 and "3 actions in total" in env.instructions()
    _, _, term, trunc, info = env.step(answer("Down", "Up", "Down", "Up", "Down"))
    assert trunc and not term and info["num_actions"] == 3 and info["actions_left"] == 0


def test_same_seed_and_answers_give_the_same_trajectory():
    answers = [
        answer("Up", "Left", "Left"),
        "garbage",
        answer("Right", "Down", "Jump", "Down"),
        answer("Left", "Up", "Right", "Right", "Down"),
    ]

    def play(seed: int) -> list:
        env = SokobanEnv(**PRESETS["LargeSokoban"], action_budget=20)
        out: list = [env.reset(seed=seed)]
        for text in answers:
            out.append(env.step(text))
        return out

    for seed in range(20):
        assert play(seed) == play(seed)


def test_different_seeds_give_different_rooms():
    env = SokobanEnv()
    rooms = {env.reset(seed=seed)[0] for seed in range(100)}
    assert len(rooms) >= 90


@pytest.mark.parametrize("preset", PRESETS)
def test_every_rendered_character_is_in_the_observation_space(preset):
    env = SokobanEnv(**PRESETS[preset], **UNLIMITED)
    rng = np.random.default_rng(0)
    for seed in range(100):
        obs, _ = env.reset(seed=seed)
        assert env.observation_space.contains(obs)
        for _ in range(3):
            obs, _, term, *_ = env.step(answer(*rng.choice(env.action_names, size=5)))
            assert env.observation_space.contains(obs)
            if term:
                break
    if PRESETS[preset]["dim_room"] == (6, 6):
        # Hand-built rooms with every symbol (the player is drawn in two ways, so two rooms).
        vocab = PRESETS[preset].get("vocab", "standard")
        seen = set()
        for text in (ALL_SYMBOLS, TWO_BOXES):
            room = render_room(parse_room(text), vocab)
            obs, _ = env.reset(options={"room": room})
            assert obs == room and env.observation_space.contains(obs)
            seen |= set(obs)
        assert seen - {"\n"} == set(VOCABS[vocab].values())


def test_new_vocab_avoids_standard_symbols_and_is_explained():
    env = SokobanEnv(**PRESETS["SokobanNewVocab"])
    for seed in range(200):
        obs, _ = env.reset(seed=seed)
        assert not set(obs) & set(STANDARD_SYMBOLS)
    room = render_room(parse_room(ALL_SYMBOLS), "new")
    assert not set(room) & set(STANDARD_SYMBOLS)
    text = env.instructions()
    assert all(symbol in text for symbol in VOCABS["new"].values())
    assert "#" not in text and "√" not in text
    standard = SokobanEnv().instructions()
    assert all(symbol in standard for symbol in STANDARD_SYMBOLS)


def test_instructions_give_task_actions_and_budgets():
    env = SokobanEnv(max_actions_per_turn=4, separator=";", action_budget=7)
    text = env.instructions()
    assert "box onto a target" in text and "Up, Down, Left, Right" in text
    assert "up to 4 actions" in text and "';'" in text and "7 actions in total" in text


def test_room_text_round_trips_and_state_is_a_snapshot():
    env, obs = env_in(TWO_BOXES)
    state = env.state()
    assert render_room(state) == obs and parse_room(obs) == state
    assert state.player == (1, 1) and state.boxes == {(1, 2), (3, 2)} and not state.is_solved
    env.step(answer("Right"))
    assert env.state() != state and state.player == (1, 1)


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"room": "#####\n#P_X#\n#__O#\n#####\n#####"}, ValueError, "5x5 but this env draws 6x6"),
        ({"room": TWO_BOXES.replace("_", "?", 1)}, ValueError, "unknown symbol '\\?'"),
        ({"room": TWO_BOXES.replace("#_X", "#PX")}, ValueError, "exactly one player"),
        ({"room": TWO_BOXES.replace("#_X", "#__")}, ValueError, "as many targets as boxes"),
        ({"room": "######\n#P_#\n"}, ValueError, "equal length"),
        ({"room": 42}, TypeError, "as text"),
        ({"map": TWO_BOXES}, ValueError, "unknown reset options"),
    ],
)
def test_bad_reset_options(options, error, match):
    with pytest.raises(error, match=match):
        SokobanEnv().reset(seed=0, options=options)


def test_room_option_is_read_in_the_active_vocab():
    new_room = render_room(parse_room(TWO_BOXES), "new")
    env, obs = env_in(new_room, vocab="new")
    assert obs == new_room
    with pytest.raises(ValueError, match="unknown symbol"):
        SokobanEnv(vocab="new").reset(options={"room": TWO_BOXES})


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dim_room": (4, 6)}, "dim_room"),
        ({"dim_room": (6,)}, "dim_room"),
        ({"num_boxes": 0}, "num_boxes"),
        ({"dim_room": (5, 5), "num_boxes": 7}, "too few"),
        ({"search_depth": 0}, "search_depth"),
        ({"num_player_moves": -1}, "num_player_moves"),
        ({"max_steps": 0}, "max_steps"),
        ({"vocab": "fancy"}, "vocab"),
        ({"action_budget": 0}, "action_budget"),
        ({"distance_shaping": -0.5}, "distance_shaping"),
        ({"distance_shaping": float("nan")}, "distance_shaping"),
        ({"distance_shaping": "1"}, "distance_shaping"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SokobanEnv(**kwargs)


def test_generation_failure_names_the_parameters(monkeypatch):
    monkeypatch.setattr(sokoban_gen, "_MAX_ATTEMPTS", 1)
    messages = []
    for seed in range(20):
        try:
            sokoban_gen.generate_room(np.random.default_rng(seed), (5, 5), 6, 1, 0)
        except RuntimeError as err:
            messages.append(str(err))
    assert messages and "dim_room=(5, 5), num_boxes=6, search_depth=1" in messages[0]


def test_solver_finds_shortest_paths_and_reports_unsolvable_rooms():
    # The player must walk around the box to push it left onto the target.
    room = parse_room("######\n#O_X_#\n#___P#\n#____#\n#____#\n######")
    assert solve(room) == ["Up", "Left", "Left"]
    assert solve(parse_room(ONE_PUSH_TO_WIN)) == ["Right"]
    solved = parse_room("######\n#P√__#\n#____#\n#____#\n#____#\n######")
    assert solved.is_solved and solve(solved) == []
    cornered = parse_room("######\n#X___#\n#__P_#\n#___O#\n#____#\n######")
    assert solve(cornered) is None
    # Each box alone could be pushed onto a target, but the first is stuck behind the second.
    jammed = parse_room("######\n#PXXO#\n####O#\n######\n######\n######")
    assert solve(jammed) is None


def test_solver_state_limit():
    room = parse_room("########\n#P_____#\n#______#\n#__X___#\n#______#\n#_____O#\n########")
    assert solve(room) is not None
    with pytest.raises(SolverLimitError, match="max_states=5"):
        solve(room, max_states=5)
