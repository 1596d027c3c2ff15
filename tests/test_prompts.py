"""The prompt is the user's to set: every part of the wording (``prompt``), per run and per
env of a mixture, with ``full`` and ``compact`` as presets; and the answer's tags
(``think_tags`` / ``answer_tags`` in env_config), which the env's parser reads."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import tiny_config, tiny_dict

import ragen_envs
from ragen_rllib.chat.prompts import (
    FORMAT_HINT,
    PRESETS,
    SYSTEM_PROMPT,
    prompt_format,
    render_turn,
    with_instructions,
)
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner


def test_the_presets_render_the_documented_texts():
    full = render_turn(2, "GRID", 4, 0.5, "full")
    assert full == f"Reward: 0.50\nTurn 2:\nState:\nGRID\nYou have 4 actions left. {FORMAT_HINT}"
    assert render_turn(1, "GRID", None, None, "full") == f"Turn 1:\nState:\nGRID\n{FORMAT_HINT}"
    assert render_turn(2, "GRID", 4, -0.1, "compact") == "Reward: -0.10\nGRID"
    assert PRESETS["full"].system == SYSTEM_PROMPT and PRESETS["compact"].system is None
    env = gym.make("ragen/Bandit-v0").unwrapped
    env.reset(seed=0)
    assert with_instructions(env, "T", "full") == env.instructions() + "\n\nT"
    assert with_instructions(env, "T", "compact") == env.instructions() + "\nT"


def test_every_part_can_be_set_and_the_rest_stays_the_presets():
    fmt = prompt_format(
        "full",
        {
            "system": None,
            "turn": "[{turn}] {observation}{budget}{reward}|{format_hint}",
            "reward": " (got {reward:+.1f})",
            "budget": " {actions_left} moves",
            "format_hint": "Answer <a>move</a>.",
            "separator": " :: ",
            "prefill": "",
        },
    )
    assert fmt.system is None and fmt.prefill == ""
    assert render_turn(3, "G", 2, 1.0, fmt) == "[3] G 2 moves (got +1.0)|Answer <a>move</a>."
    assert render_turn(1, "G", None, None, fmt) == "[1] G|Answer <a>move</a>."
    only_system = prompt_format("compact", {"system": "You play games."})
    assert only_system.system == "You play games."
    assert only_system.turn == PRESETS["compact"].turn
    # An observation with braces is text, not a template.
    assert render_turn(1, "{x} {observation}", None, None, fmt).startswith("[1] {x} {observation}")


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"sytem": "x"}, ["sytem", "allowed", "format_hint"]),
        ({"turn": "{obs}"}, ["prompt.turn", "'obs'", "observation"]),
        ({"turn": "Turn {turn}"}, ["prompt.turn", "{observation}"]),
        ({"reward": "{reward:.2q}"}, ["prompt.reward"]),
        ({"budget": "{left}"}, ["prompt.budget", "actions_left"]),
        ({"format_hint": None}, ["prompt.format_hint", "a string"]),
        ({"turn": "{observation} {"}, ["prompt.turn"]),
    ],
)
def test_a_bad_part_names_the_key_before_ray(overrides, names):
    with pytest.raises(ValueError) as err:
        tiny_config(prompt=overrides).check()
    for name in names:
        assert name in str(err.value)


def mix_config(mix, **overrides):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    base = {k: v for k, v in tiny_dict(**overrides).items() if k not in ("env", "env_groups")}
    return StarPOConfig.from_user_dict({**base, "env_mix": mix})


def test_a_bad_mixture_entry_prompt_names_the_entry():
    mix = [
        {"env": "ragen/Bandit-v0", "groups": 1},
        {"env": "ragen/FrozenLakeNoSlip-v0", "groups": 1, "prompt": {"turn": "{grid}"}},
    ]
    with pytest.raises(ValueError, match=r"env_mix\[1\]\.prompt\.turn"):
        mix_config(mix).check()


def test_the_runner_renders_each_envs_own_wording(tmp_path):
    """The run's wording for one env of a mixture, an entry's own for the other: the
    first prompt's text and the sequence's system message follow each."""
    mix = [
        {"env": "ragen/Bandit-v0", "groups": 1},
        {
            "env": "ragen/FrozenLakeNoSlip-v0",
            "groups": 1,
            "prompt": {"system": "You walk on ice.", "format_hint": "Move with <answer>."},
        },
    ]
    cfg = mix_config(
        mix,
        prompt={"turn": "Round {turn}. {observation}\n{format_hint}", "format_hint": "Pick."},
        max_new_tokens=4,
    )
    cfg.check()
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    trajs = runner.sample()
    by_env = {t.env_id: t for t in trajs}
    bandit, lake = by_env["ragen/Bandit-v0"], by_env["ragen/FrozenLakeNoSlip-v0"]
    assert bandit.turn_prompts[0].endswith("Round 1. " + bandit.turn_observations[0] + "\nPick.")
    assert lake.turn_prompts[0].endswith(
        "Round 1. " + lake.turn_observations[0] + "\nMove with <answer>."
    )
    text = {t.env_id: runner.tokenizer.decode(t.segments[0].input_ids) for t in trajs}
    assert SYSTEM_PROMPT in text["ragen/Bandit-v0"]
    assert "You walk on ice." in text["ragen/FrozenLakeNoSlip-v0"]
    assert SYSTEM_PROMPT not in text["ragen/FrozenLakeNoSlip-v0"]


def test_answer_tags_are_the_envs_to_read():
    env = gym.make("ragen/Bandit-v0", think_tags=["<plan>", "</plan>"], answer_tags=["[", "]"])
    env.reset(seed=0)
    *_, info = env.step("<plan> the big one </plan> [Dragon]")
    assert info["format_ok"] and info["action_is_valid"]
    env.reset(seed=0)
    *_, info = env.step("<think> x </think> <answer> Dragon </answer>")
    assert not info["format_ok"]
    countdown = gym.make("ragen/Countdown-v0", answer_tags=["<expr>", "</expr>"]).unwrapped
    countdown.reset(seed=0)
    assert "<expr>" in countdown.instructions() and "<answer>" not in countdown.instructions()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"answer_tags": ["<a>"]}, "answer_tags must be two"),
        ({"answer_tags": ["<a>", " "]}, "answer_tags must be two"),
        ({"answer_tags": ["<t>", "</t>"], "think_tags": ["<t>", "</t>"]}, "distinct"),
        ({"answer_tags": ["<answer>", "<answer>!"]}, "distinct"),
        ({"answer_tags": ["a|", "|b"], "separator": "|"}, "must not overlap"),
    ],
)
def test_bad_tags_are_refused_by_the_parser(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ragen_envs.ParserConfig(**kwargs)
