"""context_window: prompts that keep the last k turns, one training sequence per turn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import learner_batch, learner_logp_gap, tiny_config

from ragen_rllib.chat.prompts import render_turn, with_instructions
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule


def config(**overrides):
    base = {
        "env": "ragen/FrozenLakeNoSlip-v0",
        "llm": "builtin",
        "prompt_style": "compact",
        "env_config": {"instructions": "compact", "max_actions_per_turn": 1},
        "group_size": 3,
        "max_turns": 4,
        "max_new_tokens": 16,
        "minibatch_size": 2,
        "advantage_estimator": "gae",
        "seed": 5,
    }
    return tiny_config(**{**base, **overrides})


def _sample(**overrides):
    runner = LLMEnvRunner(config=config(**overrides), worker_index=0)
    return runner, runner.sample()


@pytest.fixture(scope="module")
def full_and_wide():
    """The same seeds with the whole history and with a window as long as the episode."""
    return _sample(), _sample(context_window=4)


def test_a_window_covering_the_episode_sees_the_same_tokens(full_and_wide):
    (_, full), (_, wide) = full_and_wide
    multi_turn = 0
    for f, w in zip(full, wide, strict=True):
        # Identical prompts and sampling seeds: the same answers, rewards and ends.
        assert f.answers == w.answers and f.turn_rewards == w.turn_rewards
        assert len(f.segments) == 1 and len(w.segments) == f.num_turns
        stream = f.segments[0]
        for k, (seg, start, end) in enumerate(w.turn_spans):
            assert seg == k
            row = w.segments[k]
            # Turn k's sequence is the full sequence up to the end of turn k's answer.
            _, f_start, f_end = f.turn_spans[k]
            assert (start, end) == (f_start, f_end)
            assert row.input_ids[:end] == stream.input_ids[:end]
            assert row.response_mask[:start] == [0] * start and row.response_mask[start:end] == [
                1
            ] * (end - start)
            assert row.behaviour_logp[start:end] == stream.behaviour_logp[start:end]
        multi_turn += f.num_turns > 1
    assert multi_turn > 0


def _user_text(runner, t, j: int) -> str:
    """The user text of turn j (0-based), rendered from what the trajectory recorded."""
    reward = None if j == 0 else t.turn_rewards[j - 1]
    actions_left = 10 if j == 0 else t.turn_infos[j - 1]["actions_left"]  # budget 10 at reset
    return render_turn(j + 1, t.turn_observations[j], actions_left, reward, "compact")


@pytest.mark.parametrize("window", [0, 1, 2])
def test_each_turn_sees_the_instructions_and_the_last_k_turns(window):
    runner, trajs = _sample(context_window=window)
    env = runner._make_envs(runner._mix[:1])[0].unwrapped
    eos = runner.tokenizer.eos_token_id
    checked = 0
    for t in trajs:
        assert len(t.segments) == t.num_turns == len(t.turn_observations)
        for k, (seg, start, end) in enumerate(t.turn_spans):
            first = max(0, k - window)
            history = [
                (t.turn_ids(j), t.turn_ids(j)[-1] == eos, _user_text(runner, t, j + 1))
                for j in range(first, k)
            ]
            expected = runner.chat.conversation_ids(
                with_instructions(env, _user_text(runner, t, first), "compact"), history
            )
            row = t.segments[seg]
            assert seg == k and row.input_ids[:start] == expected
            # Only this turn's answer carries loss; earlier answers are context.
            assert sum(row.response_mask) == end - start == sum(row.response_mask[start:end])
            checked += k > window
    assert checked > 0  # some turns had more history than the window keeps


def test_token_in_token_out_and_advantages_per_turn_rows():
    runner, trajs = _sample(context_window=0, advantage_estimator="gae", lambda_=0.9)
    cfg = runner.config
    diff, _, batch = learner_logp_gap(cfg, trajs)
    assert batch["input_ids"].shape[0] == sum(len(t.segments) for t in trajs)
    assert diff <= 1e-4, diff
    # The per-trajectory columns were used and removed: every column has one row per sequence.
    assert {len(v) for v in batch.values()} == {batch["input_ids"].shape[0]}
    assert torch.all(batch["advantages"][batch["response_mask"] == 0] == 0)


def test_gae_is_the_same_for_one_sequence_and_for_a_covering_window(full_and_wide):
    (runner, full), (_, wide) = full_and_wide
    results = []
    for trajs in (full, wide):
        cfg = config(advantage_estimator="bilevel_gae", context_window=None)
        torch.manual_seed(0)
        module = LLMRLModule(
            observation_space=None, action_space=None, model_config=cfg.llm_module_config()
        )
        batch = learner_batch(cfg, module, trajs)
        mask = batch["response_mask"] > 0
        per_traj = []
        for b in range(len(trajs)):
            rows = batch["row_trajectory"] == b
            # Each generated token once, in order: the last row holds every turn under the
            # whole history; under the window each row holds its own turn.
            per_traj.append(
                torch.cat(
                    [
                        torch.stack([batch["advantages"][r], batch["value_targets"][r]])[:, mask[r]]
                        for r in torch.nonzero(rows).flatten().tolist()
                    ],
                    1,
                )
            )
        results.append(per_traj)
    for a, b in zip(*results, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=1e-5)


def test_context_window_config_rules():
    assert config(context_window=None).context_window is None
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(ValueError, match="context_window"):
            config(context_window=bad).check_values()


@pytest.mark.parametrize("window", [None, 0])
def test_gigpo_turn_advantages_land_on_their_turns_tokens(window):
    from ragen_rllib.connectors.sample_batch import build_sample_pipeline
    from ragen_rllib.maths.advantages import gigpo_advantages

    # The first seed whose batch has a step group that disagrees with its episode (a
    # group with a success), so that turn-level advantages are not all alike.
    for seed in range(1, 11):
        runner, trajs = _sample(
            context_window=window, advantage_estimator="gigpo", group_size=4, seed=seed
        )
        cfg = runner.config
        build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs)
        expected = gigpo_advantages(
            [t.turn_rewards for t in trajs],
            [t.group for t in trajs],
            [t.turn_observations for t in trajs],
            gamma=cfg.gigpo_gamma,
        )
        assert [t.turn_advantages for t in trajs] == [pytest.approx(e) for e in expected]
        if any(len(set(e)) > 1 for e in expected):  # some turns differ from their episode
            break
    else:
        pytest.fail("no seed in 1-10 sampled a batch whose turns' advantages differ")
    batch = build_learner_pipeline(cfg)(rl_module={}, batch={}, episodes=trajs)["default_policy"]
    row = 0
    for t in trajs:
        for k, (seg, start, end) in enumerate(t.turn_spans):
            tokens = batch["advantages"][row + seg, start:end]
            assert torch.allclose(tokens, torch.full_like(tokens, t.turn_advantages[k]))
        rows = batch["row_trajectory"] == trajs.index(t)
        assert int(rows.sum()) == len(t.segments)
        row += len(t.segments)
    assert torch.all(batch["advantages"][batch["response_mask"] == 0] == 0)
