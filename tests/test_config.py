"""StarPOConfig validation and the `rllib` command's input checks: all before Ray starts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ragen_rllib.config import STARPO_DEFAULTS, StarPOConfig


def make(**overrides) -> StarPOConfig:
    base = {"env": "ragen/Bandit-v0", "llm": "builtin-raw"}
    return StarPOConfig.from_user_dict({**base, **overrides})


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"env": "ragen/NoSuchEnv-v0"}, ["env", "ragen/NoSuchEnv-v0", "ragen/SimpleSokoban-v0"]),
        ({"advantage_estimator": "grpo", "group_size": 1}, ["group_size", "GRPO"]),
        ({"lr": -1e-6}, ["lr", "-1e-06", "> 0"]),
        ({"critic_lr": 0}, ["critic_lr", "> 0"]),
        ({"advantage_estimator": "ppo"}, ["advantage_estimator", "'gae'", "'grpo'"]),
        ({"clip_high": 1.5}, ["clip_high", "(0, 1)"]),
        ({"filter_keep_ratio": 0.0}, ["filter_keep_ratio", "(0, 1]"]),
        ({"env_groups": 0}, ["env_groups", ">= 1"]),
        ({"max_turns": 2.5}, ["max_turns", "integer"]),
        ({"minibatch_size": 64, "env_groups": 8, "group_size": 4}, ["minibatch_size", "8"]),
        ({"model_dtype": "float8"}, ["model_dtype", "bfloat16"]),
        ({"rollout_device": "tpu"}, ["rollout_device", "'auto'", "'cuda'"]),
    ],
)
def test_bad_values_name_the_key_and_the_allowed_values(overrides, names):
    with pytest.raises(ValueError) as err:
        make(**overrides).check()
    for name in names:
        assert name in str(err.value)


def test_unknown_key_is_rejected_with_the_known_ones():
    with pytest.raises(ValueError) as err:
        make(grup_size=4)
    assert "grup_size" in str(err.value) and "group_size" in str(err.value)


def test_missing_model_path_names_the_path(tmp_path):
    missing = tmp_path / "no-model-here"
    with pytest.raises(FileNotFoundError, match="no-model-here"):
        make(llm=str(missing)).check()


def test_defaults_are_the_papers_starpo_s_values():
    cfg = StarPOConfig()
    assert (cfg.env_groups, cfg.group_size, cfg.max_turns) == (8, 16, 5)
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip) == (0.2, 0.28, 3.0)
    assert (cfg.kl_coeff, cfg.entropy_coeff, cfg.filter_keep_ratio) == (0.0, 0.001, 0.25)
    assert (cfg.lr, cfg.critic_lr, cfg.grad_clip, cfg.minibatch_size) == (1e-6, 1e-5, 1.0, 32)
    assert (cfg.gamma, cfg.lambda_, cfg.eval_num_states, cfg.eval_temperature) == (1, 1, 256, 0.5)


def test_yaml_lambda_and_rllib_keys_are_accepted():
    cfg = make(**{"lambda": 0.9, "gamma": 0.99, "seed": 3, "num_epochs": 2})
    assert (cfg.lambda_, cfg.gamma, cfg.seed, cfg.num_epochs) == (0.9, 0.99, 3, 2)
    assert set(STARPO_DEFAULTS) <= set(cfg.to_dict()) | {"lambda_"}


def _rllib(*args, cwd, env=None) -> subprocess.CompletedProcess:
    code = "import sys; from ragen_rllib.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env=None if env is None else {**os.environ, **env},
    )


@pytest.mark.parametrize(
    "yaml_text, message",
    [
        ("exp: [unclosed", "not valid YAML"),
        ("exp:\n  run: PPO\n  env: ragen/Bandit-v0\n", "run='PPO'"),
        ("exp:\n  run: StarPO\n  envv: x\n", "envv"),
        ("exp:\n  run: StarPO\n  env: ragen/Nope-v0\n", "ragen/Nope-v0"),
        (
            "exp:\n  run: StarPO\n  env: ragen/Bandit-v0\n  config: {llm: builtin-raw, lr: -1}\n",
            "lr",
        ),
    ],
)
def test_rllib_train_rejects_bad_files_before_ray_starts(tmp_path, yaml_text, message):
    path = tmp_path / "exp.yaml"
    path.write_text(textwrap.dedent(yaml_text))
    proc = _rllib("train", "file", str(path), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout


def test_rllib_train_rejects_bad_override_json(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("exp:\n  run: StarPO\n  env: ragen/Bandit-v0\n")
    proc = _rllib("train", "file", str(path), "--stop", "{training_iteration: 2}", cwd=tmp_path)
    assert proc.returncode == 2 and "--stop is not valid JSON" in proc.stderr


def test_fluent_training_takes_starpo_and_rllib_keys():
    cfg = (
        StarPOConfig()
        .environment("ragen/Bandit-v0")
        .training(group_size=4, advantage_estimator="grpo", lr=3e-5, minibatch_size=8)
    )
    assert (cfg.group_size, cfg.advantage_estimator, cfg.lr, cfg.minibatch_size) == (
        4,
        "grpo",
        3e-5,
        8,
    )
    with pytest.raises(TypeError, match="grup_size"):
        StarPOConfig().training(grup_size=4)


def test_grid_search_points_are_each_checked_before_ray(tmp_path):
    from ragen_rllib.cli import build_config, param_space, split_grid_search

    base, grid = split_grid_search({"lr": {"grid_search": [1e-4, 3e-4]}, "group_size": 4})
    assert base == {"group_size": 4} and grid == {"lr": [1e-4, 3e-4]}
    exp = {
        "env": "ragen/Bandit-v0",
        "config": {"llm": "builtin-raw", "lr": {"grid_search": [1e-4, 3e-4]}},
    }
    config, grid = build_config(exp, {})
    space = param_space(config, grid)
    assert space["lr"] == {"grid_search": [1e-4, 3e-4]} and space["env"] == "ragen/Bandit-v0"
    bad = {
        "env": "ragen/Bandit-v0",
        "config": {"llm": "builtin-raw", "lr": {"grid_search": [1e-4, -1]}},
    }
    with pytest.raises(ValueError, match=r"lr=-1 .*grid point \{'lr': -1\}"):
        build_config(bad, {})
    path = tmp_path / "exp.yaml"
    path.write_text(
        "exp:\n  run: StarPO\n  env: ragen/Bandit-v0\n  config: {lr: {grid_search: []}}\n"
    )
    proc = _rllib("train", "file", str(path), cwd=tmp_path)
    assert proc.returncode == 2 and "grid_search" in proc.stderr


def test_unloadable_hub_model_fails_before_ray(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        "exp:\n  run: StarPO\n  env: ragen/Bandit-v0\n  config: {llm: no-such-org/no-such-model}\n"
    )
    # Offline, as on a machine without the hub: the same error path, without network retries.
    proc = _rllib("train", "file", str(path), cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "llm='no-such-org/no-such-model'" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks a machine without a GPU"
)
def test_gpu_example_on_a_machine_without_gpu_fails_before_ray(tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "tuned_examples" / "sokoban_starpo.yaml"
    proc = _rllib("train", "file", str(example), "--config", '{"llm": "builtin-raw"}', cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "asks for 1 GPU(s)" in proc.stderr and "has 0" in proc.stderr
    assert "Started a local Ray instance" not in proc.stderr + proc.stdout
