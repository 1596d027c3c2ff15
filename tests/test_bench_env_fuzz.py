"""bench/bench_env_fuzz.py at a small size: every registered env takes each kind of
adversarial answer (including a megabyte one) without an exception, a bad
observation or a non-finite reward."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import ragen_envs

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_env_fuzz", ROOT / "bench/bench_env_fuzz.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


@pytest.mark.parametrize("env_id", ragen_envs.ENV_IDS)
def test_every_env_survives_the_fuzz(env_id):
    # The full run's every 10,000th answer is a megabyte; here 300 answers of the three
    # kinds, then a megabyte answer of each kind on its own.
    result = bench.fuzz(env_id, 300, seed=1)
    assert result["exceptions"] == 0, result["first_error"]
    assert result["bad_observations"] == result["bad_rewards"] == 0
    assert result["episodes"] >= 1
    env = gym.make(env_id)
    rng = np.random.default_rng(0)
    for k in (9_999, 19_999, 29_999):  # kinds 0, 1, 2
        env.reset(seed=k)
        huge = bench.answer(rng, env.unwrapped, k)
        assert len(huge) >= 1_000_000
        obs, reward, *_ = env.step(huge)
        assert isinstance(obs, str) and isinstance(reward, float)
