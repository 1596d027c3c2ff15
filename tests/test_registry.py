"""Every registered id: gymnasium.make, the env checker, determinism, robustness to any text.

Most ids read ``<answer>`` as action names from a vocabulary (TextEnv); the ids in
ANSWER_IDS read it as free text (AnswerEnv). The generic checks run on every id; the
checks that concern an action vocabulary run on the ids that have one."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from hypothesis import given, settings
from hypothesis import strategies as st

import ragen_envs
from ragen_envs import BUILTIN_MODEL_ENV_IDS, ENV_IDS, GAME_ENV_IDS, AnswerEnv

#: The ids whose answer is free text (an expression, placements), read by AnswerEnv.
ANSWER_IDS = tuple(i for i in ENV_IDS if isinstance(gym.make(i).unwrapped, AnswerEnv))

TAG_SOUP = st.lists(
    st.one_of(
        st.sampled_from(["<think>", "</think>", "<answer>", "</answer>", "||", "Up", "left"]),
        st.sampled_from(["Dragon", "phoenix", "Librarian", "Trader", "Teacher", "Engineer"]),
        st.sampled_from(["r1c2=3", "R4C4 = 1", "=", "(", ")", "+", "-", "*", "/", "7", "0"]),
        st.text(max_size=12),
    ),
    max_size=25,
).map("".join)


def test_ids_are_registered():
    assert set(ENV_IDS) <= set(gym.registry)
    assert len(ENV_IDS) == 22
    # The built-in model was pretrained on every registered env but the two-player games.
    assert BUILTIN_MODEL_ENV_IDS + GAME_ENV_IDS == ENV_IDS
    games = ("ragen/TicTacToe", "ragen/KuhnPoker", "ragen/SimpleNegotiation")
    assert all(i.startswith(games) for i in GAME_ENV_IDS)
    assert ANSWER_IDS  # some ids read free text; exactly those have no action names
    for env_id in ENV_IDS:
        assert bool(gym.make(env_id).unwrapped.action_names) == (env_id not in ANSWER_IDS)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_make_and_env_checker(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    text = env.unwrapped.instructions()
    assert str(env.unwrapped.action_budget) in text
    if env_id in ANSWER_IDS:
        assert f"<answer>{env.unwrapped.answer_example}</answer>" in text, text
    else:
        assert "Actions" in text


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_answers_same_trajectory(env_id):
    answers = [
        "<think>a</think><answer>Up || Left || Dragon</answer>",
        "garbage",
        "<think>b</think><answer>Right||Down||Down||Trader||Phoenix</answer>",
        "<think>c</think><answer>Left||Left||Up</answer>",
        "<think>d</think><answer>(1 + 2) * 3 || r1c1=1 || r2c2=2</answer>",
    ]

    def play(seed):
        env = gym.make(env_id)
        out = [env.reset(seed=seed)[0]]
        for text in answers:
            obs, r, term, trunc, info = env.step(text)
            out.append((obs, r, term, trunc, sorted(info.items())))
            if term or trunc:
                out.append(env.reset(seed=seed + 1)[0])
        return out

    assert play(3) == play(3)
    first_obs = {gym.make(env_id).reset(seed=s)[0] for s in range(20)}
    assert len(first_obs) > 1


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_megabyte_answers_do_not_raise(env_id):
    env = gym.make(env_id)
    for text in [
        "<think>" * 300_000,
        "\U0001f600" * 1_000_000,
        "<think>" + "x" * 1_000_000 + "</think><answer>" + "Up||" * 100_000 + "</answer>",
        "<think>x</think><answer>" + "(" * 1_000_000 + "1" + ")" * 1_000_000 + "</answer>",
        "<think>x</think><answer>" + "r1c1=1||" * 100_000 + "</answer>",
    ]:
        env.reset(seed=1)
        obs, reward, *_ = env.step(text)
        assert isinstance(obs, str) and isinstance(reward, float)


@pytest.mark.parametrize("env_id", ENV_IDS)
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.text(), TAG_SOUP), min_size=1, max_size=4))
def test_step_never_raises_and_penalty_is_exact(env_id, texts):
    env = gym.make(env_id)
    env.reset(seed=0)
    inner = env.unwrapped
    for text in texts:
        obs, reward, term, trunc, info = env.step(text)
        assert env.observation_space.contains(obs), obs
        if isinstance(inner, AnswerEnv):
            # Free text: the tags decide format_ok; the env judges what is inside.
            block = ragen_envs.read_answer_block(text, inner.parser.require_think)
            body = block.body.strip()
            assert info["format_ok"] == (
                block.format_ok and 0 < len(body) <= inner.max_answer_length
            )
            assert info["action_is_valid"] <= info["format_ok"]
            expected_penalty = 0.0 if info["action_is_valid"] else inner.format_penalty
            assert info["action_is_valid"] == (
                info["format_ok"] and not info["num_invalid_actions"]
            )
        else:
            parsed = ragen_envs.parse_answer(text, inner.action_names, inner.parser)
            expected_penalty = 0.0 if parsed.is_valid else inner.format_penalty
            assert info["num_actions"] <= len(parsed.actions)
        assert info["format_penalty"] == expected_penalty
        assert reward == pytest.approx(info["env_reward"] + expected_penalty)
        if term or trunc:
            break


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_compact_instructions_are_short_and_name_every_action(env_id):
    full = gym.make(env_id).unwrapped
    compact = gym.make(env_id, instructions="compact").unwrapped
    full.reset(seed=3)
    compact.reset(seed=3)
    short = compact.instructions()
    assert len(short) < len(full.instructions()) / 2, short
    names = compact.action_names
    if env_id.startswith("ragen/SimpleNegotiation"):  # 500 offers: named by their pattern
        assert "offer N GOOD for M GOOD" in short, short
        names = [name for name in names if not name.startswith("offer ")]
    assert all(name in short for name in names), short
    if env_id in ANSWER_IDS:  # no action names: the answer's shape instead
        assert compact.answer_example in short, short
    # Only the prompt changes: same states, same dynamics.
    assert compact.reset(seed=5)[0] == full.reset(seed=5)[0]
    with pytest.raises(ValueError, match="instructions must be one of"):
        gym.make(env_id, instructions="terse")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_coordinates_line_names_every_landmark_of_the_grid(env_id):
    plain = gym.make(env_id).unwrapped
    if not plain.landmark_symbols:  # the bandits draw no grid
        with pytest.raises(ValueError, match="coordinates=True needs a grid env"):
            gym.make(env_id, coordinates=True)
        return
    env = gym.make(env_id, coordinates=True).unwrapped
    rng = np.random.default_rng(0)
    for seed in range(20):
        obs, _ = env.reset(seed=seed)
        grid, _ = plain.reset(seed=seed)
        for _ in range(4):
            assert env.observation_space.contains(obs), obs
            *rows, line = obs.split("\n")
            assert "\n".join(rows) == grid  # the grid itself is unchanged
            listed = {}
            for entry in line.split("; "):
                symbol, *cells = entry.split(" ")
                listed[symbol] = {tuple(map(int, cell.split(","))) for cell in cells}
            drawn = {}
            for r, row in enumerate(rows):
                for c, cell in enumerate(row):
                    if cell in env.landmark_symbols:
                        drawn.setdefault(cell, set()).add((r, c))
            assert listed == drawn
            action = env.action_names[int(rng.integers(len(env.action_names)))]
            answer = f"<think>x</think><answer>{action}</answer>"
            obs, _, term, trunc, _ = env.step(answer)
            grid, *_ = plain.step(answer)  # same seed: the same slips and ends
            if term or trunc:
                break
    with pytest.raises(ValueError, match="coordinates must be true or false"):
        gym.make(env_id, coordinates="yes")


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_neighbours_line_says_what_each_move_runs_into(env_id):
    """Checked by playing each move on a copy: the edge or a wall never moves you, a
    free tile moves you, a hole ends the episode in failure and the goal in success."""
    plain = gym.make(env_id).unwrapped
    if not plain.move_offsets:  # no grid, no line
        with pytest.raises(ValueError, match="neighbours=True needs a grid env"):
            gym.make(env_id, neighbours=True)
        return
    lake = isinstance(plain, ragen_envs.FrozenLakeEnv)
    # No slips, so that a copy's step is the move the line describes.
    env = gym.make(env_id, neighbours=True, **({"slip_rate": 0.0} if lake else {})).unwrapped
    # Ice, floor and free targets (both Sokoban vocabs); the edge or a wall.
    free, blocked = set("_.") | (set() if lake else set("O+")), set("#%")
    seen = set()
    rng = np.random.default_rng(0)
    for seed in range(40):
        obs, _ = env.reset(seed=seed)
        for _ in range(4):
            assert env.observation_space.contains(obs), obs
            line = obs.split("\n")[-1]
            entries = dict(entry.split(" ") for entry in line.split("; "))
            assert list(entries) == list(env.move_offsets)
            for move, symbol in entries.items():
                seen.add(symbol)
                trial = copy.deepcopy(env)
                _, _, term, _, info = trial.step(f"<think>x</think><answer>{move}</answer>")
                if symbol in blocked:
                    assert not info["action_is_effective"], (obs, move)
                elif symbol in free:
                    assert info["action_is_effective"] and not term, (obs, move)
                elif lake and symbol == "O":
                    assert term and not info["success"], (obs, move)
                elif lake and symbol == "G":
                    assert term and info["success"], (obs, move)
            action = env.action_names[int(rng.integers(len(env.action_names)))]
            obs, _, term, trunc, _ = env.step(f"<think>x</think><answer>{action}</answer>")
            if term or trunc:
                break
    # Every branch above ran: on a lake a hole and the goal were beside you.
    assert seen & blocked and seen & free, seen
    if lake:
        assert {"O", "G"} <= seen, seen
    with pytest.raises(ValueError, match="neighbours must be true or false"):
        gym.make(env_id, neighbours=1)


def test_neighbours_line_off_the_grid_speaks_the_envs_vocab():
    """A room without an outer ring: off the grid reads as the vocab's wall."""
    for vocab, wall in (("standard", "#"), ("new", "%")):
        env = gym.make(
            "ragen/SimpleSokoban-v0", vocab=vocab, dim_room=(5, 5), neighbours=True
        ).unwrapped
        sym = ragen_envs.grids.sokoban.VOCABS[vocab]
        # You in the top-left corner, a box to your right, its target below it.
        f, p, b, t = sym["floor"], sym["player"], sym["box"], sym["target"]
        room = "\n".join([f"{p}{b}{f * 3}", f"{f}{t}{f * 3}", *[f * 5] * 3])
        obs, _ = env.reset(seed=0, options={"room": room})
        assert obs.split("\n")[-1] == f"Up {wall}; Down {f}; Left {wall}; Right {b}"
        assert env.observation_space.contains(obs), obs
    lake = gym.make("ragen/FrozenLakeNoSlip-v0", neighbours=True).unwrapped
    obs, _ = lake.reset(seed=0)
    assert obs.count("\n") == lake.size  # the grid, then the line alone


def test_the_grid_line_examples_in_the_docstrings_hold():
    import doctest

    import ragen_envs.core.base

    result = doctest.testmod(ragen_envs.core.base)
    assert result.attempted >= 2 and result.failed == 0, result


def test_the_flat_module_paths_of_earlier_releases_still_import():
    """Envs live in family folders; every old flat path is the same module object."""
    import importlib

    from ragen_envs._old_paths import MOVED

    for old, new in MOVED.items():
        assert importlib.import_module(old) is importlib.import_module(new), old
    from ragen_envs.remote import OpenEnvTextEnv  # the old client module's names
    from ragen_envs.remote.client import OpenEnvTextEnv as same

    assert OpenEnvTextEnv is same


def test_python_dash_m_runs_the_old_and_the_new_module_paths():
    import subprocess
    import sys

    for name in ("ragen_envs.serve", "ragen_envs.remote.serve", "ragen_envs.demo"):
        out = subprocess.run([sys.executable, "-m", name, "--help"], capture_output=True,
                             text=True, timeout=120)  # fmt: skip
        assert out.returncode == 0 and "usage:" in out.stdout, (name, out.stderr[-500:])
