"""A user's own environment: `module:EnvId` ids, `env_module`, and a plain gymnasium.Env
that offers only str observations and step(str), trained through `rllib train file`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import private_env, tiny_config, tiny_dict

from ragen_rllib.chat.prompts import FORMAT_HINT
from ragen_rllib.env_choice.env_loading import make_env, success_of
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

ROOT = Path(__file__).resolve().parents[1]
USER_ENVS = Path(__file__).resolve().parent / "user_envs"
#: The tiny config's values for a one-turn user env (the env itself is set per test).
SMALL = {k: v for k, v in tiny_dict(max_new_tokens=8).items() if k != "env"}


@pytest.fixture(autouse=True)
def user_envs_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(USER_ENVS))


@pytest.fixture
def user_envs_unimported(monkeypatch):
    """Neither my_text_envs nor its ids are known yet (as in a fresh process): only
    the config's own spelling can import and register them. Restored afterwards."""
    monkeypatch.delitem(sys.modules, "my_text_envs", raising=False)
    for env_id in ("SayTheWord-v0", "FlakySayTheWord-v0"):
        monkeypatch.delitem(gym.registry, env_id, raising=False)


@pytest.mark.parametrize(
    "spelling",
    [
        {"env": "my_text_envs:SayTheWord-v0"},
        {"env": "SayTheWord-v0", "env_module": "my_text_envs"},
        {"env": "SayTheWord-v0", "env_module": ["json", "my_text_envs"]},
    ],
)
def test_module_colon_id_and_env_module_pass_the_check(user_envs_unimported, spelling):
    """Each spelling imports the user's module itself, passes the check, and makes
    the user's env, which resets and steps as the user wrote it."""
    # Unknown under its bare id until the config names the module.
    with pytest.raises(ValueError, match="is not a registered env id"):
        tiny_config(**SMALL, env="SayTheWord-v0").check()
    cfg = tiny_config(**SMALL, **spelling)
    cfg.check()
    module = sys.modules["my_text_envs"]  # imported by the check, from the config
    env = make_env(cfg)
    assert env.spec.id == "SayTheWord-v0"
    assert type(env.unwrapped) is module.SayTheWord
    words = set()
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        # The user's own reset, seed for seed: "Say <word>", nothing in info.
        assert (obs, info) == module.SayTheWord().reset(seed=seed)
        word = re.fullmatch(r"Say (Up|Down|Left|Right)", obs).group(1)
        words.add(word)
        _, reward, terminated, truncated, _ = env.step(f"<answer>{word}</answer>")
        assert (reward, terminated, truncated) == (1.0, True, False)
    assert len(words) > 1  # the seed reaches the user's env


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"env": "no_such_pkg.envs:Game-v0"}, r"config env: importing the env module 'no_such_pkg"),
        (
            {"env": "Game-v0", "env_module": "no_such_pkg"},
            r"config env_module: importing the env module 'no_such_pkg'",
        ),
        ({"env": "json:NotRegistered-v0"}, r"env='json:NotRegistered-v0' is not a registered"),
        ({"env": "Unknown-v9"}, r"use 'module:EnvId' or name the module .* `env_module`"),
        ({"env": "SayTheWord-v0", "env_module": 3}, r"config env_module=3 is invalid"),
        ({"env": "SayTheWord-v0", "env_module": []}, r"config env_module=\[\] is invalid"),
        ({"env": "a:b:c"}, r"at most one ':'"),
        ({"env": 7}, r"config env=7 is invalid"),
    ],
)
def test_env_errors_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_config(**{**SMALL, **overrides}).check()


def test_plain_env_uses_the_documented_fallbacks():
    runner = LLMEnvRunner(
        config=tiny_config(**SMALL, env="my_text_envs:SayTheWord-v0"),
        worker_index=0,
    )
    trajs = runner.sample()
    assert len(trajs) == 4 and all(t.end_reason == "terminated" for t in trajs)
    prompt = runner.tokenizer.decode(trajs[0].segments[0].input_ids)
    # No instructions(): the first user message is turn 1 alone; no actions_left: no line.
    assert "<|im_start|>user\nTurn 1:\nState:\nSay " in prompt
    assert "actions left" not in prompt and FORMAT_HINT in prompt
    # No info["success"]: success is a positive reward on the last turn.
    for t in trajs:
        assert t.success == (t.turn_rewards[-1] > 0)
    assert success_of({"success": False}, 1.0) is False and success_of({}, 0.5) is True


@pytest.mark.slow
def test_train_file_trains_a_users_env_in_every_ray_process(tmp_path):
    """The module is importable only through PYTHONPATH and is registered nowhere else:
    the trial process and the remote env runner must import it themselves."""
    exp = tmp_path / "mine.yaml"
    config = "\n".join(f"    {k}: {v}" for k, v in SMALL.items())
    exp.write_text(
        "by-env-module:\n"
        "  run: StarPO\n"
        "  env: SayTheWord-v0\n"
        "  stop: {training_iteration: 2}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n"
        "    env_module: my_text_envs\n"
        "    num_env_runners: 1\n"
        f"{config}\n"
        "by-module-id:\n"
        "  run: StarPO\n"
        "  env: my_text_envs:SayTheWord-v0\n"
        "  stop: {training_iteration: 2}\n"
        "  checkpoint_config: {checkpoint_at_end: false}\n"
        "  config:\n"
        f"{config}\n"
    )
    storage = tmp_path / "results"
    env = private_env(tmp_path, PYTHONPATH=str(USER_ENVS))
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(exp),
         "--storage-path", str(storage)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in ("by-env-module", "by-module-id"):
        trial = next((storage / name).glob("StarPO_*"))
        rows = [json.loads(line) for line in (trial / "result.json").read_text().splitlines()]
        assert [r["training_iteration"] for r in rows] == [1, 2], name
        for row in rows:
            assert row["rollout"]["num_trajectories"] == 4
            assert row["rollout"]["env_errors"] == 0
            assert "policy_loss" in row["learners"]["default_policy"]


def test_the_readme_env_example_keeps_to_its_own_spaces():
    """The README's GuessNumber, as printed there: every observation it returns lies
    in the observation space it declares (gymnasium's checker warns otherwise)."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    (code,) = [b for b in blocks if "class GuessNumber" in b]
    namespace: dict = {}
    exec(code.replace('gym.register(id="GuessNumber-v0"', "dict(id=None"), namespace)
    env = namespace["GuessNumber"]()
    obs, _ = env.reset(seed=0)
    seen = [obs]
    for answer in ("<answer> 4 </answer>", "no", "<answer> 9 </answer>", "<answer> 1 </answer>"):
        obs, *_ = env.step(answer)
        seen.append(obs)
    assert all(env.observation_space.contains(o) for o in seen), seen
    assert env.action_space.contains("<answer> 4 </answer>")
