"""The critic-free estimators and reward normalisation, against hand-computed values.

The batch (through the sample-stage connector, no Ray): two initial states, two env
ids that do not follow them, one turn per trajectory unless said otherwise.

    trajectory      0    1    2    3    4
    initial state   0    0    0    1    1
    env id          A    A    A    A    B
    total reward    1    2    3    5    1
"""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from conftest import tiny_config

from ragen_rllib.connectors.sample_batch import GroupAdvantages, build_sample_pipeline
from ragen_rllib.maths.advantages import gigpo_advantages, group_normalize, whiten_turns
from ragen_rllib.maths.estimators import ESTIMATORS, AdvantageSettings
from ragen_rllib.records.trajectory import Trajectory

REWARDS = [1.0, 2.0, 3.0, 5.0, 1.0]
STATES = [0, 0, 0, 1, 1]
ENVS = ["A", "A", "A", "A", "B"]
EPS = 1e-6


def batch(turn_rewards=None, tokens=None) -> list[Trajectory]:
    turn_rewards = turn_rewards or [[r] for r in REWARDS]
    tokens = tokens or [[4] * len(r) for r in turn_rewards]
    trajs = []
    for i, (rewards, toks) in enumerate(zip(turn_rewards, tokens, strict=True)):
        spans, pos = [], 0
        for n in toks:
            spans.append((0, pos, pos + n))
            pos += n + 3  # observation tokens between turns
        trajs.append(
            Trajectory(
                env_id=ENVS[i % 5],
                seed=i,
                group=STATES[i % 5],
                turn_rewards=list(rewards),
                turn_spans=spans,
                turn_observations=[f"obs{i}-{k}" for k in range(len(rewards))],
            )
        )
    return trajs


def advantages(estimator, method, grouping="state", gamma=1.0, trajs=None) -> list[list[float]]:
    trajs = trajs or batch()
    settings = AdvantageSettings(reward_norm=method, gamma=gamma)
    GroupAdvantages(estimator, settings, grouping)(rl_module=None, batch={}, episodes=trajs)
    return [t.turn_advantages for t in trajs]


def first(rows):
    return [row[0] for row in rows]


S1 = math.sqrt(8.0)  # sample std of (5, 1)


@pytest.mark.parametrize(
    "estimator, method, grouping, expected",
    [
        # GRPO: state groups (1, 2, 3) mean 2 std 1, and (5, 1) mean 3 std sqrt(8).
        (
            "grpo", "mean_std", "state",
            [-1 / (1 + EPS), 0, 1 / (1 + EPS), 2 / (S1 + EPS), -2 / (S1 + EPS)],
        ),
        # Dr. GRPO: no std scaling.
        ("dr_grpo", "mean", "state", [-1, 0, 1, 2, -2]),
        # RLOO: against the mean of the others: 1 - 2.5, 2 - 2, 3 - 1.5; 5 - 1, 1 - 5.
        ("rloo", "mean", "state", [-1.5, 0, 1.5, 4, -4]),
        # The whole batch as the group: mean 12 / 5 = 2.4.
        ("grpo", "mean", "batch", [-1.4, -0.4, 0.6, 2.6, -1.4]),
        # By env id: A = (1, 2, 3, 5) mean 2.75; B = (1) alone, so 0.
        ("grpo", "mean", "env", [-1.75, -0.75, 0.25, 2.25, 0]),
        # RLOO over the batch: each against the mean of the other four.
        ("rloo", "mean", "batch", [1 - 11 / 4, 2 - 10 / 4, 3 - 9 / 4, 5 - 7 / 4, 1 - 11 / 4]),
        ("grpo", "identity", "state", REWARDS),
    ],
)  # fmt: skip
def test_group_baseline_estimators(estimator, method, grouping, expected):
    assert first(advantages(estimator, method, grouping)) == pytest.approx(expected, abs=1e-6)


def test_asym_clip_is_mean_std_clipped_to_minus_one_and_three():
    # (0, 10, 10, 10): mean 7.5, sample std 5, so z = (-1.5, 0.5, 0.5, 0.5).
    got = group_normalize(torch.tensor([0.0, 10.0, 10.0, 10.0]), [0, 0, 0, 0], "asym_clip")
    assert got.tolist() == pytest.approx([-1.0, 0.5, 0.5, 0.5], abs=1e-6)
    # (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10): z of the 10 is 4.25.
    spike = torch.zeros(20)
    spike[-1] = 10.0
    got = group_normalize(spike, [0] * 20, "asym_clip")
    assert got[-1].item() == pytest.approx(3.0)
    assert got[0].item() == pytest.approx(-0.5 / math.sqrt(5))


def test_reinforce_pp_whitens_discounted_turn_returns_over_tokens():
    # Trajectory 0: rewards (0, 1) with 3 and 2 tokens; trajectory 1: reward 1, 5 tokens.
    # gamma 0.5: returns (0.5, 1) and (1). Over the 10 tokens: 0.5 three times, 1 seven
    # times; mean 0.85, sample variance 0.525 / 9.
    trajs = batch([[0.0, 1.0], [1.0]], [[3, 2], [5]])
    got = advantages("reinforce_pp", None, gamma=0.5, trajs=trajs)
    std = math.sqrt(0.525 / 9)
    assert got[0] == pytest.approx([-0.35 / std, 0.15 / std], abs=1e-6)
    assert got[1] == pytest.approx([0.15 / std], abs=1e-6)


def test_reinforce_pp_baseline_subtracts_the_group_mean_then_whitens():
    # One state, totals (1, 0, 2): minus the mean 1 gives (0, -1, 1), on 2, 1 and 1
    # tokens; over the 4 tokens the mean is 0 and the sample variance 2 / 3.
    trajs = batch([[1.0], [0.0], [2.0]], [[2], [1], [1]])
    got = advantages("reinforce_pp_baseline", "mean", trajs=trajs)
    s = math.sqrt(2 / 3)
    assert first(got) == pytest.approx([0.0, -1 / s, 1 / s], abs=1e-6)


def test_whiten_turns_weighs_turns_by_their_tokens():
    out = whiten_turns([[1.0, 3.0]], [[3, 1]])  # tokens: 1, 1, 1, 3: mean 1.5
    std = math.sqrt((3 * 0.25 + 2.25) / 3)
    assert out[0] == pytest.approx([-0.5 / std, 1.5 / std], abs=1e-6)
    assert whiten_turns([[1.0]], [[0]]) == [[0.0]]  # no tokens, no weight


def test_gigpo_with_the_batch_as_the_episode_group():
    rewards = [[0, 1], [0, 0, 1], [0], [1, 0], [0]]
    anchors = [["s", "t"], ["s", "u", "t"], ["s"], ["s", "t"], ["s"]]
    got = gigpo_advantages(
        rewards, [0, 0, 0, 1, 1], anchors, gamma=0.5, norm="mean", episode_groups=[9] * 5
    )
    # Episode part: totals (1, 1, 0, 1, 0) minus the batch mean 0.6. Step groups are
    # still anchored within each initial state: (0, s) returns (0.5, 0.25, 0) - 0.25,
    # (0, t) (1, 1) - 1, (1, s) (1, 0) - 0.5; singletons 0.
    assert got[0] == pytest.approx([0.4 + 0.25, 0.4], abs=1e-9)
    assert got[2] == pytest.approx([-0.6 - 0.25], abs=1e-9)
    assert got[3] == pytest.approx([0.4 + 0.5, 0.4], abs=1e-9)
    assert got[4] == pytest.approx([-0.6 - 0.5], abs=1e-9)


def test_every_turn_of_a_trajectory_gets_its_episode_advantage():
    trajs = batch([[0.0, 1.0], [0.0, 0.0], [2.0]])  # totals 1, 0, 2 in state 0
    got = advantages("rloo", "mean", trajs=trajs)
    assert got == [[0.0, 0.0], [-1.5, -1.5], [1.5]]


@pytest.mark.parametrize(
    "overrides, names",
    [
        (
            {"advantage_estimator": "gae", "reward_norm_method": "mean"},
            ["reward_norm_method='mean'", "group baseline", "'gae'"],
        ),
        (
            {"advantage_estimator": "reinforce_pp", "reward_norm_grouping": "batch"},
            ["reward_norm_grouping='batch'", "'reinforce_pp'"],
        ),
        (
            {"advantage_estimator": "dr_grpo", "reward_norm_method": "mean_std"},
            ["reward_norm_method='mean_std'", "std"],
        ),
        ({"advantage_estimator": "rloo", "group_size": 1}, ["group_size=1", "'rloo'", "'batch'"]),
        ({"reward_norm_grouping": "prompt"}, ["reward_norm_grouping='prompt'", "'state'"]),
        ({"reward_norm_method": "zscore"}, ["reward_norm_method='zscore'", "'asym_clip'"]),
        ({"loss_agg": "sum"}, ["loss_agg='sum'", "'seq-mean-token-sum-norm'"]),
    ],
)
def test_config_names_bad_estimator_settings(overrides, names):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    config = StarPOConfig.from_user_dict(
        {"env": "ragen/Bandit-v0", "advantage_estimator": "grpo", "minibatch_size": 1, **overrides}
    )
    with pytest.raises(ValueError) as err:
        config.check_values()
    for name in names:
        assert name in str(err.value), str(err.value)


def test_estimator_defaults_follow_the_papers():
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    def used(**kw):
        c = StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0", **kw})
        return c.reward_norm_method_used, c.loss_agg_used

    assert used(advantage_estimator="grpo") == ("mean_std", "token-mean")
    assert used(advantage_estimator="dr_grpo") == ("mean", "seq-mean-token-sum-norm")
    assert used(advantage_estimator="rloo") == ("mean", "token-mean")
    assert used(advantage_estimator="gae") == (None, "token-mean")
    assert used(advantage_estimator="grpo", reward_norm_method="asym_clip")[0] == "asym_clip"
    base = {"env": "ragen/Bandit-v0", "max_new_tokens": 20}
    assert StarPOConfig.from_user_dict({**base, "max_turns": 3}).loss_norm_tokens == 60
    assert StarPOConfig.from_user_dict({**base, "context_window": 0}).loss_norm_tokens == 20


def test_seq_mean_token_sum_norm_divides_by_a_constant_not_the_length():
    from ragen_rllib.learner.loss_terms import aggregate_loss

    loss = torch.tensor([[1.0, 1.0, 1.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    # Sums 3 and 2, each over the constant 4, averaged over the 2 sequences.
    assert aggregate_loss(loss, mask, "seq-mean-token-sum-norm", norm_tokens=4).item() == (
        pytest.approx((3 / 4 + 2 / 4) / 2)
    )
    # seq-mean-token-mean would give (1 + 2) / 2: the short sequence weighs more.
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="norm_tokens"):
        aggregate_loss(loss, mask, "seq-mean-token-sum-norm")


def game(rewards_and_seats):
    """Two-turn trajectories of env "G", two a group, each (reward, seat) given."""
    return [
        Trajectory(env_id="G", seed=i, group=i // 2, turn_rewards=[0.0, r],
                   turn_infos=[{"seat": seat}, {"seat": seat}])
        for i, (r, seat) in enumerate(rewards_and_seats)
    ]  # fmt: skip


def test_rae_subtracts_a_running_baseline_per_env_and_seat():
    """SPIRAL's role-conditioned advantage: the reward minus its (env, seat) baseline,
    which then moves toward each reward with decay 0.95, from 0, across batches."""
    rae = GroupAdvantages("rae", AdvantageSettings(rae_decay=0.95))
    first_batch = game([(1.0, 0), (0.0, 1), (-1.0, 0), (0.0, 1)])
    rae(rl_module=None, batch={}, episodes=first_batch)
    # Baselines start at 0: the advantage is the reward, on every turn.
    assert [t.turn_advantages for t in first_batch] == [[1.0] * 2, [0.0] * 2, [-1.0] * 2, [0.0] * 2]
    seat0 = 0.95 * (0.95 * 0.0 + 0.05 * 1.0) + 0.05 * -1.0  # -0.0025
    assert rae.role_baselines == {("G", 0): pytest.approx(seat0), ("G", 1): 0.0}
    second = game([(1.0, 0), (-1.0, 1)])
    rae(rl_module=None, batch={}, episodes=second)
    assert second[0].turn_advantages == pytest.approx([1.0 - seat0] * 2)
    assert second[1].turn_advantages == pytest.approx([-1.0] * 2)
    assert ESTIMATORS["rae"].default_reward_norm is None  # no group baseline knobs


def test_a_non_finite_reward_never_reaches_an_rae_baseline():
    """A NaN reward gets advantage 0 and leaves its seat's baseline as it was: the
    batches after it are scored as if it had not come."""
    rae = GroupAdvantages("rae", AdvantageSettings(rae_decay=0.5))
    first = game([(float("nan"), 0), (1.0, 0), (float("inf"), 1), (0.0, 1)])
    rae(rl_module=None, batch={}, episodes=first)
    assert [t.turn_advantages for t in first] == [[0.0] * 2, [1.0] * 2, [0.0] * 2, [0.0] * 2]
    assert rae.role_baselines == {("G", 0): 0.5, ("G", 1): 0.0}
    later = game([(1.0, 0), (1.0, 1)])
    rae(rl_module=None, batch={}, episodes=later)
    assert [t.turn_advantages for t in later] == [[0.5] * 2, [1.0] * 2]


def test_rae_baselines_are_in_the_sample_stages_state():
    """The pipeline's state (what a checkpoint saves) carries RAE's baselines; a new
    pipeline given it scores the next batch as the old one does."""
    config = tiny_config(advantage_estimator="rae")
    stage = build_sample_pipeline(config)
    stage(rl_module=None, batch={}, episodes=game([(1.0, 0), (0.0, 0), (-1.0, 1), (1.0, 1)]))
    state = pickle.loads(pickle.dumps(stage.get_state()))
    assert state == {"GroupAdvantages": {"role_baselines": [
        ["G", 0, pytest.approx(0.0475)], ["G", 1, pytest.approx(0.0025)]]}}  # fmt: skip
    restored = build_sample_pipeline(config)
    restored.set_state(state)
    a, b = game([(1.0, 0), (1.0, 1)]), game([(1.0, 0), (1.0, 1)])
    stage(rl_module=None, batch={}, episodes=a)
    restored(rl_module=None, batch={}, episodes=b)
    assert [t.turn_advantages for t in b] == [t.turn_advantages for t in a]
    assert b[0].turn_advantages == pytest.approx([1.0 - 0.0475] * 2)


def test_state_seat_grouping_compares_a_seat_with_itself_in_its_state():
    """reward_norm_grouping state_seat: the baseline of a self-play trajectory is the
    mean of its group's rollouts at the same seat (the same deal, the same side)."""
    seats_rewards = [(0, -2.0), (1, 2.0), (0, -1.0), (1, 1.0)]  # one group: two games
    trajs = [
        Trajectory(env_id="G", seed=0, group=0, turn_rewards=[r], turn_infos=[{"seat": s}])
        for s, r in seats_rewards
    ]
    stage = GroupAdvantages("grpo", AdvantageSettings(reward_norm="mean"), grouping="state_seat")
    stage(rl_module=None, batch={}, episodes=trajs)
    # Seat 0 lost 2 and 1 (mean -1.5), seat 1 won 2 and 1 (mean 1.5).
    assert [t.turn_advantages[0] for t in trajs] == [-0.5, 0.5, 0.5, -0.5]
    by_state = GroupAdvantages("grpo", AdvantageSettings(reward_norm="mean"), grouping="state")
    by_state(rl_module=None, batch={}, episodes=trajs)  # the zero-sum group's mean is 0
    assert [t.turn_advantages[0] for t in trajs] == [-2.0, 2.0, -1.0, 1.0]
