"""Test-only text environments that `ragen_envs` does not register.

Importing this module registers them with Gymnasium, the way a user's own
package would. They use only the required part of the text protocol (``str``
observations, ``step(str)``): no ``instructions()``, no ``info["actions_left"]``
and no ``info["success"]``.
"""

from __future__ import annotations

import re
import string

import gymnasium as gym

WORDS = ("Up", "Down", "Left", "Right")


class SayTheWord(gym.Env):
    """One turn: the observation names a word; answering with it pays 1, else 0."""

    def __init__(self):
        self.observation_space = gym.spaces.Text(64, charset=string.printable)
        self.action_space = gym.spaces.Text(256, charset=string.printable)
        self.word = WORDS[0]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return f"Say {self.word}", {}

    def step(self, action: str):
        match = re.search(r"<answer>(.*?)</answer>", action, re.S)
        said = match.group(1).strip() if match else ""
        reward = 1.0 if said.lower() == self.word.lower() else 0.0
        return "done", reward, True, False, {}


class FlakySayTheWord(SayTheWord):
    """SayTheWord that raises in reset() or step() for the seeds it is given, returns a
    NaN reward for ``nan_reward_seeds``, and starts with a long observation (about
    2,000 characters) for ``long_seeds``."""

    def __init__(self, fail_reset_seeds=(), fail_step_seeds=(), long_seeds=(), nan_reward_seeds=()):
        super().__init__()
        self.nan_reward_seeds = set(nan_reward_seeds)
        self.observation_space = gym.spaces.Text(4096, charset=string.printable)
        self.fail_reset_seeds = set(fail_reset_seeds)
        self.fail_step_seeds = set(fail_step_seeds)
        self.long_seeds = set(long_seeds)
        self.seed_ = None

    def reset(self, *, seed=None, options=None):
        if seed in self.fail_reset_seeds:
            raise RuntimeError(f"reset failed for seed {seed}")
        self.seed_ = seed
        obs, info = super().reset(seed=seed, options=options)
        if seed in self.long_seeds:
            obs += ". " + "Mind the long story of this room. " * 60
        return obs, info

    def step(self, action: str):
        if self.seed_ in self.fail_step_seeds:
            raise ValueError(f"step failed for seed {self.seed_}")
        obs, reward, term, trunc, info = super().step(action)
        if self.seed_ in self.nan_reward_seeds:
            reward = float("nan")
        return obs, reward, term, trunc, info


gym.register(id="SayTheWord-v0", entry_point=SayTheWord)
gym.register(id="FlakySayTheWord-v0", entry_point=FlakySayTheWord)
