"""Evaluation suites and pass@k: the estimator, the suites' options, the results' keys."""

from __future__ import annotations

import itertools
from math import comb

import pytest
from conftest import run_script, tiny_config, tiny_dict

from ragen_rllib.env_choice.eval_suites import BUILTIN_SUITES, resolve_suites, suite_entries
from ragen_rllib.maths.pass_at_k import mean_pass_at_k, pass_at_k


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_pass_at_k_is_the_chance_that_k_draws_hold_a_success(n):
    for c, k in itertools.product(range(n + 1), range(1, n + 1)):
        outcomes = [True] * c + [False] * (n - c)
        draws = list(itertools.combinations(range(n), k))
        brute = sum(any(outcomes[i] for i in d) for d in draws) / len(draws)
        assert pass_at_k(n, c, k) == pytest.approx(brute, abs=1e-12)
        assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)
    assert pass_at_k(n, 1, 1) == pytest.approx(1 / n)


def test_mean_pass_at_k_averages_states_and_refuses_k_above_n():
    states = [[True, False, False, False], [False] * 4, [True] * 4]
    assert mean_pass_at_k(states, 1) == pytest.approx((0.25 + 0 + 1) / 3)
    assert mean_pass_at_k(states, 4) == pytest.approx((1 + 0 + 1) / 3)
    with pytest.raises(ValueError, match="k <= samples"):
        mean_pass_at_k(states, 5)


def test_builtin_suites_and_their_env_names():
    assert suite_entries(["bandit"])["bandit"] == [
        (name, env, cfg) for name, env, cfg in BUILTIN_SUITES["bandit"]
    ]
    names = [n for n, _, _ in suite_entries("frozenlake")["frozenlake"]]
    assert names == ["slip_0.00", "slip_0.33", "slip_0.67"]
    own = suite_entries({"mine": ["ragen/BanditRev-v0", {"env": "ragen/Bandit-v0", "name": "t"}]})
    assert own == {"mine": [("BanditRev", "ragen/BanditRev-v0", {}), ("t", "ragen/Bandit-v0", {})]}


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("chess", "not a built-in suite"),
        ({"s": []}, "non-empty list"),
        ({"s": [{"env_id": "ragen/Bandit-v0"}]}, r"eval_suites\['s'\]\[0\]"),
        ({"a/b": "bandit"}, "suite name"),
        ({"s": [{"env": "ragen/Bandit-v0", "name": "x/y"}]}, "env name"),
        ({"s": ["ragen/Bandit-v0", "ragen/Bandit-v0"]}, "repeat"),
        (7, "eval_suites=7 is invalid"),
        ([], r"eval_suites=\[\] is invalid: null, a list"),  # the user's value, not {}
        (["bandit", {"b": 2}], "a list holds built-in suite names"),
    ],
)
def test_malformed_suites_name_the_key(value, match):
    with pytest.raises(ValueError, match=match):
        suite_entries(value)


def test_suite_envs_inherit_the_runs_options_only_from_the_same_env_class():
    cfg = tiny_config(
        env="ragen/FrozenLakeNoSlip-v0",
        env_config={"instructions": "compact", "coordinates": True, "max_actions_per_turn": 1},
        eval_suites=["frozenlake", "sokoban"],
    )
    suites = resolve_suites(cfg)
    slip = {e.name: e.env_config for e in suites["frozenlake"]}
    # The run's prompt options, the id's registered options, then the entry's slip rate.
    assert slip["slip_0.33"]["coordinates"] is True
    assert slip["slip_0.33"]["slip_rate"] == pytest.approx(1 / 3)
    assert slip["slip_0.00"]["max_actions_per_turn"] == 1
    sokoban = {e.name: e.env_config for e in suites["sokoban"]}
    assert "coordinates" not in sokoban["large"]  # another class: its own options only
    assert sokoban["large"]["dim_room"] == (8, 8)
    assert sokoban["frozenlake"]["coordinates"] is True  # FrozenLake again: inherited


def test_registered_options_beat_the_runs_own():
    # A run on the bandit with another preset: BanditRev stays BanditRev.
    cfg = tiny_config(env_config={"preset": "teacher_engineer"}, eval_suites=["bandit"])
    presets = {e.name: e.env_config["preset"] for e in resolve_suites(cfg)["bandit"]}
    assert presets == {
        "train": "phoenix_dragon",
        "held_out": "librarian_trader",
        "rev": "librarian_trader_rev",
    }


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        ({"eval_pass_k": [1, 4], "eval_samples_per_state": 2}, "eval_pass_k"),
        ({"eval_pass_k": []}, "eval_pass_k"),
        ({"eval_samples_per_state": 0}, "eval_samples_per_state"),
        ({"eval_suites": {"s": ["ragen/NoSuchEnv-v0"]}}, "eval_suites"),
        ({"eval_suites": {"s": [{"env": "ragen/FrozenLake-v0", "env_config": {"slip_rate": 2}}]}},
         "eval_suites"),
    ],
)  # fmt: skip
def test_bad_evaluation_settings_name_their_key(overrides, key):
    with pytest.raises(ValueError, match=f"config {key}"):
        tiny_config(**overrides).check_values()


@pytest.mark.slow
def test_training_logs_each_suite_env_under_evaluation(tmp_path):
    """An iteration with evaluation: the training env's results and every suite env's,
    pass@1 equal to success (one answer per state counts once) and pass@k >= pass@1."""
    config = tiny_dict(
        eval_interval=1,
        eval_num_states=6,
        eval_samples_per_state=3,
        eval_pass_k=[1, 3],
        eval_suites={"names": ["ragen/BanditRev-v0", {"env": "ragen/BanditHeldOut-v0"}]},
    )
    script = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
print(json.dumps(algo.train()["evaluation"]))
"""
    ev = run_script(script, tmp_path, define={"CONFIG": config})
    assert set(ev["names"]) == {"BanditRev", "BanditHeldOut"}
    for metrics in (ev, *ev["names"].values()):
        assert metrics["num_trajectories"] == 18
        assert metrics["pass@1"] == pytest.approx(metrics["success_rate"])
        assert metrics["pass@3"] >= metrics["pass@1"]
        assert 0.0 <= metrics["format_valid_rate"] <= 1.0
        assert metrics["num_turns_mean"] == 1.0
