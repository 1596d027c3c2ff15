"""bench/probe_capacity.py's rollout ceiling: the walk that makes later-turn
training states, and the player that turns a move scorer into a success rate.

The player is checked with a scorer whose answer is known: one that reads the
coordinates line of each prompt it is given and scores the planner's move
highest must solve every calm lake, so every turn's prompt shows the state
after the previous move and the moves are applied to the right env.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import probe_capacity as probe  # noqa: E402

from ragen_envs.grids.frozenlake import shortest_path  # noqa: E402
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab  # noqa: E402

LAKE = {"coordinates": True}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(*build_vocab())


def test_the_walk_stays_on_frozen_tiles_and_renders_a_later_turn(tokenizer):
    env = probe.make_env(probe.ENVS["frozenlake"], "compact", LAKE)
    render = probe.Renderer(tokenizer, "compact", think="go")
    rng = np.random.default_rng(0)
    moved = 0
    for seed in range(50):
        obs, info = env.reset(seed=seed)
        obs, info, reward, turn = probe.random_walk(env, obs, info, rng, 3, "go")
        assert not env.holes[env.player] and env.player != env.goal
        assert info["actions_left"] == 10 - (turn - 1)
        text = tokenizer.decode(render(env, obs, info, turn, reward))
        assert obs in text and text.endswith("<think> go </think> <answer>")
        assert ("Reward:" in text) == (turn > 1)
        moved += turn > 1
    assert moved > 25  # most draws walk at least one move


def test_a_planner_scorer_solves_every_calm_lake(monkeypatch, tokenizer):
    render = probe.Renderer(tokenizer, "compact", think="go")
    move_ids = [tokenizer.convert_tokens_to_ids("Ġ" + m) for m in probe.MOVES]
    envs = [probe.make_env(probe.ENVS["frozenlake"], "compact", LAKE) for _ in range(40)]

    def planner_logits(model, prompts, prefix, pad_id):
        rows = torch.zeros(len(prompts), len(tokenizer))
        for row, ids in enumerate(prompts):
            line = re.findall(r"P (\d),(\d); G (\d),(\d)(?:; O ([\d, ]+))?", tokenizer.decode(ids))
            pr, pc, gr, gc, holes_text = line[-1]
            holes = np.zeros((4, 4), dtype=bool)
            for cell in (holes_text or "").split():
                holes[int(cell[0]), int(cell[2])] = True
            move = shortest_path(holes, (int(pr), int(pc)), (int(gr), int(gc)))[0]
            rows[row, move_ids[probe.MOVES.index(move)]] = 5.0
        return rows

    monkeypatch.setattr(probe, "move_logits", planner_logits)
    model = torch.nn.Linear(1, 1)  # play() only switches its train/eval mode
    pad = tokenizer.pad_token_id
    assert probe.play(model, envs, render, move_ids, pad, 0.0, "go", seed=0) == 1.0
    # Sampling at a high temperature makes mistakes: some lakes end in a hole.
    assert probe.play(model, envs, render, move_ids, pad, 5.0, "go", seed=0) < 1.0
