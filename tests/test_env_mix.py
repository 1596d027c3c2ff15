"""Env mixtures (``env_mix``): the config's checks, which env each group plays, the
per-env filter and baseline, and a run with remote async runners, per-env metrics
and evaluation, a rollout dump, a checkpoint and its restore."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest
from conftest import run_script, tiny_config, tiny_dict

from ragen_rllib.connectors.sample_batch import GroupAdvantages, RolloutFilter
from ragen_rllib.env_choice.env_mix import MixEntry, entry_of_group, mix_entries
from ragen_rllib.maths.estimators import AdvantageSettings
from ragen_rllib.records.trajectory import Trajectory

MIX = [
    {"env": "ragen/Bandit-v0", "groups": 1, "max_turns": 1, "prompt_style": "full"},
    {
        "env": "ragen/FrozenLakeNoSlip-v0",
        "groups": 3,
        "max_turns": 3,
        "prompt_style": "compact",
        "env_config": {"instructions": "compact"},
    },
]


def mix_dict(mix=MIX, **overrides) -> dict:
    """The tiny config with ``env_mix`` and without ``env`` and ``env_groups`` (unless
    ``overrides`` sets them)."""
    base = {k: v for k, v in tiny_dict().items() if k not in ("env", "env_groups")}
    return {**base, "env_mix": mix, "max_turns": 5, "minibatch_size": 4, **overrides}


def mix_config(mix=MIX, **overrides):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    return StarPOConfig.from_user_dict(mix_dict(mix, **overrides))


def test_env_and_env_groups_are_derived_and_a_single_env_is_a_mixture_of_one():
    config = mix_config()
    assert config.env == "ragen/Bandit-v0" and config.env_groups == 4
    entries = mix_entries(config)
    assert [(e.name, e.groups, e.max_turns, e.prompt_style) for e in entries] == [
        ("Bandit", 1, 1, "full"),
        ("FrozenLakeNoSlip", 3, 3, "compact"),
    ]
    assert [entry_of_group(entries, g).name for g in range(6)] == [
        "Bandit", "FrozenLakeNoSlip", "FrozenLakeNoSlip", "FrozenLakeNoSlip",
        "Bandit", "FrozenLakeNoSlip",  # a runner used on its own wraps around
    ]  # fmt: skip
    plain = tiny_config(env_config={"preset": "teacher_engineer"})
    (one,) = mix_entries(plain)
    assert (one.env, one.env_config, one.groups) == (
        "ragen/Bandit-v0",
        {"preset": "teacher_engineer"},
        2,
    )


@pytest.mark.parametrize(
    ("mix", "extra", "message"),
    [
        ([], {}, r"env_mix: \[\] is invalid: a non-empty list"),
        ([{"env": "ragen/Bandit-v0"}], {}, r"env_mix\[0\]: .* a mapping with `env` and `groups`"),
        ([{"env": "ragen/Bandit-v0", "groups": 0}], {}, r"env_mix\[0\]: groups=0 is invalid"),
        (
            [{"env": "ragen/Bandit-v0", "groups": 1, "turns": 2}],
            {},
            r"env_mix\[0\]: unknown key\(s\) \['turns'\]",
        ),
        ([{"env": "ragen/Nope-v0", "groups": 1}], {}, r"env_mix\[0\]: config env='ragen/Nope-v0'"),
        (
            [{"env": "ragen/Bandit-v0", "groups": 1}, {"env": "ragen/Bandit-v0", "groups": 1}],
            {},
            r"names \['Bandit', 'Bandit'\] repeat",
        ),
        (
            [{"env": "ragen/Bandit-v0", "groups": 1, "env_config": {"size": 3}}],
            {},
            r"env_mix\[0\] \(Bandit\): .* cannot be made and reset",
        ),
        (
            [{"env": "ragen/Bandit-v0", "groups": 1, "prompt_style": "terse"}],
            {},
            r"env_mix\[0\]: prompt_style='terse' is invalid",
        ),
        ([{"env": "ragen/Bandit-v0", "groups": 2}], {"env_groups": 3}, r"add up to 2"),
        (
            [{"env": "ragen/Bandit-v0", "groups": 2}],
            {"env": "ragen/FrozenLake-v0"},
            r"env='ragen/FrozenLake-v0' is invalid with env_mix",
        ),
        (
            [{"env": "ragen/Bandit-v0", "groups": 2}],
            {"env_config": {"preset": "x"}},
            r"give each entry its own env_config",
        ),
    ],
)
def test_a_bad_mixture_is_refused_naming_the_entry(mix, extra, message):
    with pytest.raises(ValueError, match=message):
        mix_config(mix, minibatch_size=2, **extra).validate()


def trajectories(spec: list[tuple[str, int, list[float]]]) -> list[Trajectory]:
    """(env name, group, rewards of its trajectories) -> one-turn trajectories."""
    return [
        Trajectory(env_id="x", env_name=name, seed=0, group=g, turn_rewards=[r])
        for name, g, rewards in spec
        for r in rewards
    ]


def test_the_filter_keeps_each_envs_share_of_its_own_groups_with_scope_env():
    # Env A's rewards spread 10x more than B's: over the whole batch B would lose
    # every group; within each env each keeps its better half.
    spec = [
        ("A", 0, [0.0, 10.0]), ("A", 1, [0.0, 9.0]),
        ("B", 2, [0.0, 1.0]), ("B", 3, [0.0, 0.5]),
    ]  # fmt: skip
    settings = ("top_k", 0.5, "largest", True, "reward_std")
    kept = {}
    for scope in ("env", "all"):
        batch = trajectories(spec)
        RolloutFilter(*settings, scope=scope)(rl_module=None, batch={}, episodes=batch)
        kept[scope] = sorted({t.group for t in batch})
    assert kept == {"env": [0, 2], "all": [0, 1]}


def test_reward_norm_grouping_env_takes_the_baseline_of_each_env():
    batch = trajectories([("A", 0, [1.0, 3.0]), ("B", 1, [10.0, 30.0])])
    stage = GroupAdvantages("grpo", AdvantageSettings(reward_norm="mean"), grouping="env")
    stage(rl_module=None, batch={}, episodes=batch)
    assert [t.turn_advantages[0] for t in batch] == [-1.0, 1.0, -10.0, 10.0]


def test_an_entry_is_an_eval_env_with_its_own_pool_key():
    a = MixEntry("a", "ragen/Bandit-v0", {}, 1)
    b = MixEntry("b", "ragen/Bandit-v0", {"preset": "teacher_engineer"}, 1)
    assert a.key != b.key


@pytest.mark.slow
def test_a_mixture_trains_with_remote_async_runners_and_resumes(tmp_path):
    script = """
import json, ray
from pathlib import Path
from ragen_rllib.algorithms.starpo.starpo import StarPO, StarPOConfig
ray.init(address="local", num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict(CONFIG).build_algo()
rows = [algo.train() for _ in range(2)]
evaluation = algo.evaluate_success(num_states=2)
path = algo.save_to_path(str(Path.cwd() / "ckpt"))
algo.stop()
again = StarPO.from_checkpoint(path)
after = again.train()
again.stop()
def pick(row):
    r = row["rollout"]
    return {name: {k: r[name][k] for k in ("num_trajectories", "num_turns_mean", "success_rate")}
            for name in ("Bandit", "FrozenLakeNoSlip")}
print(json.dumps({
    "rows": [pick(r) for r in rows],
    "filter": [r["filter"]["groups_kept"] for r in rows],
    "eval": evaluation,
    "after": after["training_iteration"],
    "after_rollout": pick(after),
}))
"""
    config = mix_dict(
        group_size=2,
        filter_keep_ratio=0.5,
        num_env_runners=2,
        async_rollouts=True,
        rollout_dump_interval=1,
        eval_pass_k=[1],
    )
    out = run_script(script, tmp_path, define={"CONFIG": config})
    for row in [*out["rows"], out["after_rollout"]]:
        assert row["Bandit"]["num_trajectories"] == 2  # 1 group x 2
        assert row["FrozenLakeNoSlip"]["num_trajectories"] == 6  # 3 groups x 2
        assert row["Bandit"]["num_turns_mean"] == 1.0  # its own max_turns
        assert row["FrozenLakeNoSlip"]["num_turns_mean"] <= 3.0
    # filter_scope env, keep 0.5: Bandit keeps its 1 group, FrozenLake 2 of 3 (rounded up).
    assert out["filter"] == [3, 3]
    assert out["after"] == 3
    ev = out["eval"]
    assert set(ev["Bandit"]) >= {"success_rate", "pass@1"}
    assert ev["Bandit"]["num_trajectories"] == 2 == ev["FrozenLakeNoSlip"]["num_trajectories"]
    mean = (ev["Bandit"]["success_rate"] + ev["FrozenLakeNoSlip"]["success_rate"]) / 2
    assert ev["success_rate"] == pytest.approx(mean)
    # Groups never mix envs, and each env's prompts are in its own style.
    files = sorted((tmp_path).rglob("rollouts/iter_*.parquet"))
    assert files, list(tmp_path.rglob("*"))[:20]
    rows = pq.read_table(files[0]).to_pylist()
    by_group = {}
    for r in rows:
        by_group.setdefault(r["group"], set()).add(r["env_name"])
    assert by_group == {0: {"Bandit"}, 1: {"FrozenLakeNoSlip"}, 2: {"FrozenLakeNoSlip"},
                        3: {"FrozenLakeNoSlip"}}  # fmt: skip
    first = {r["env_name"]: r["prompt"] for r in rows if r["turn"] == 0}
    assert "Turn 1:" in first["Bandit"]  # the full style
    assert "Turn 1:" not in first["FrozenLakeNoSlip"]  # the compact style
