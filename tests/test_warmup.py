"""The format warm-up (``format_warmup_steps``): well-formed answers with random actions on
the run's own prompts, trained once, cached, and then what the run loads."""

from __future__ import annotations

import json
import os
from collections import Counter

import gymnasium as gym
import pytest
from conftest import tiny_config

from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.warmup import format_warmup as warmup


def test_examples_are_the_runs_prompts_with_well_formed_answers_and_no_policy():
    from transformers import AutoTokenizer

    cfg = tiny_config(env="ragen/Bandit-v0", prompt={"system": "Pick an arm."})
    tok = AutoTokenizer.from_pretrained(warmup.model_path(cfg))
    examples = warmup.warmup_examples(cfg, tok, 200, seed=0)
    env = gym.make("ragen/Bandit-v0").unwrapped
    arms = Counter()
    for prompt, answer in examples:
        assert answer[-1] == tok.eos_token_id
        text = tok.decode(prompt)
        assert "Pick an arm." in text and text.endswith("<think>")
        env.reset(seed=0)
        reply = "<think>" + tok.decode(answer[:-1])
        *_, info = env.step(reply)
        assert info["format_ok"] and info["action_is_valid"], reply
        arms[reply.split("<answer>")[1].split("</answer>")[0].strip()] += 1
    # Random arms: both, about equally often, whichever the state's order.
    assert set(arms) == {"Phoenix", "Dragon"} and min(arms.values()) > 70
    # The states come from seeds training and evaluation never draw.
    assert warmup.WARMUP_SEED_BASE > 2**32


def test_the_warmed_model_is_trained_once_cached_and_loaded_by_the_run(monkeypatch):
    cfg = tiny_config(format_warmup_steps=2, format_warmup_batch=2, format_warmup_lr=1e-4)
    path = warmup.model_path(cfg)
    record = json.load(open(os.path.join(path, warmup.RECORD_FILE)))
    assert len(record["loss"]) == 2 and record["settings"]["lr"] == 1e-4
    assert cfg.llm_module_config()["model_path"] == path
    assert LLMEnvRunner(config=cfg, worker_index=0)._model_path == path

    def no_training(*args, **kwargs):
        raise AssertionError("the cached warm-up should have been used")

    monkeypatch.setattr(warmup, "train_format_warmup", no_training)
    assert warmup.model_path(cfg) == path
    # Another learning rate or env is another warm-up; the group count is not.
    assert warmup.model_path(tiny_config(format_warmup_steps=2, format_warmup_batch=2,
                                         format_warmup_lr=1e-4, env_groups=4)) == path  # fmt: skip
    with pytest.raises(AssertionError, match="cached warm-up"):
        warmup.model_path(
            tiny_config(format_warmup_steps=2, format_warmup_batch=2, format_warmup_lr=2e-4)
        )
    assert warmup.model_path(tiny_config()) != path  # no warm-up: the base model


def test_the_check_refuses_a_prefill_that_cannot_start_the_format_and_trains_nothing(
    monkeypatch,
):
    """The config check (and so `rllib train --dry-run`) stays quick: the warm-up runs
    in the algorithm's setup, not in the check."""

    def no_training(*args, **kwargs):
        raise AssertionError("the check must not run the warm-up")

    monkeypatch.setattr(warmup, "train_format_warmup", no_training)
    with pytest.raises(ValueError, match=r"format_warmup_steps=3.*prefill '<answer>'"):
        tiny_config(format_warmup_steps=3, prefill="<answer>").check()
    tiny_config(format_warmup_steps=3, prefill="").check()


def test_state_notes_say_true_things_about_the_grid_and_choose_nothing():
    """The think text of ``format_warmup_think: state``: where the goal (or a box's
    target) lies, what is next to the player, read off the env's own state."""
    lake = gym.make("ragen/FrozenLakeNoSlip-v0").unwrapped
    lake.reset(seed=0)  # _G__ / OO__ / _OO_ / OP__: the player at 3,1, the goal at 0,1
    assert (lake.player, lake.goal) == ((3, 1), (0, 1))
    assert lake.state_notes() == (
        "The goal is 3 up of me. Up and Left are holes. Down is the edge."
    )
    room = gym.make("ragen/SimpleSokoban-v0").unwrapped
    room.reset(seed=0)  # the player at 3,1, the box at 3,2, its target at 4,4
    assert room.state_notes() == (
        "A box is 1 right of me; its nearest target is 1 down and 2 right of it."
    )
    for env in (lake, room):  # no move is named: the notes choose nothing
        assert not any(move in env.state_notes() for move in ("Right.", "Down."))
    assert gym.make("ragen/Bandit-v0").unwrapped.state_notes() is None


def test_a_state_warm_up_thinks_the_envs_notes_with_random_moves_on_the_envs_budget():
    from transformers import AutoTokenizer

    cfg = tiny_config(
        env="ragen/FrozenLakeNoSlip-v0",
        env_config={"max_actions_per_turn": 1},
        max_turns=3,
        format_warmup_steps=1,
        format_warmup_think="state",
    )
    tok = AutoTokenizer.from_pretrained(warmup.model_path(tiny_config()))
    examples = warmup.warmup_examples(cfg, tok, 120, seed=0)
    env = gym.make("ragen/FrozenLakeNoSlip-v0", max_actions_per_turn=1).unwrapped
    moves = Counter()
    for i, (_, answer) in enumerate(examples):
        env.reset(seed=warmup.WARMUP_SEED_BASE + i)  # the example's state
        reply = "<think>" + tok.decode(answer[:-1])
        think = reply.split("<think>")[1].split("</think>")[0]
        assert " ".join(think.split()) == env.state_notes()
        *_, info = env.step(reply)
        assert info["format_ok"] and info["num_actions"] == 1, reply
        moves[reply.split("<answer>")[1].split("</answer>")[0].strip()] += 1
    # One move an answer, each of the four about equally often: no policy.
    assert set(moves) == {"Up", "Down", "Left", "Right"} and min(moves.values()) > 15
    with pytest.raises(ValueError, match=r"format_warmup_think='state'.*Bandit.*state_notes"):
        tiny_config(format_warmup_steps=1, format_warmup_think="state").check()


def test_the_warm_up_trains_on_the_gpu_only_when_the_learner_runs_here_on_one(monkeypatch):
    import torch

    def cfg(**kw):
        return tiny_config(format_warmup_steps=1, **kw)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert warmup.warmup_device(cfg()) == "cpu"  # no GPU asked for
    assert warmup.warmup_device(cfg(num_gpus_per_learner=1)) == "cpu"  # none visible
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert warmup.warmup_device(cfg(num_gpus_per_learner=1)) == "cuda"
    assert warmup.warmup_device(cfg()) == "cpu"
    # Remote learners hold the GPUs: the driver keeps off them.
    assert warmup.warmup_device(cfg(num_learners=2, num_gpus_per_learner=1)) == "cpu"
