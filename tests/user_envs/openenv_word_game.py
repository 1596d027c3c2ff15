"""A foreign OpenEnv env (not a ragen text env) and the adapter subclass that maps it.

``python openenv_word_game.py --port PORT`` serves :class:`WordGame` with OpenEnv's own
server: its action is ``{"word": str}`` and its observation ``{"prompt": str}``,
names of its own, with no ``terminated``, ``info`` or ``instructions``. The
tests play it twice: through ``env_config`` field names, and through
:class:`WordGameEnv`, the subclass docs/remote_envs.md shows.
"""

from __future__ import annotations

import random
import re
import sys

import gymnasium as gym
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from ragen_envs.remote.client import OpenEnvTextEnv

WORDS = ("apple", "river", "stone", "cloud")


class WordAction(Action):
    word: str


class WordObservation(Observation):
    prompt: str


class WordGame(Environment[WordAction, WordObservation, State]):
    """Say the word the prompt names: reward 1 and done; else 0, three tries."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.target, self.tries = State(), WORDS[0], 0

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target = random.Random(seed).choice(WORDS)
        self._state, self.tries = State(episode_id=episode_id), 0
        return WordObservation(prompt=f"Say the word {self.target}.")

    def step(self, action, timeout_s=None, **kwargs):
        self.tries += 1
        self._state.step_count += 1
        hit = action.word.strip().lower() == self.target
        done = hit or self.tries >= 3
        prompt = "Right." if hit else f"No. Say the word {self.target}."
        return WordObservation(prompt=prompt, reward=float(hit), done=done, metadata={"hit": hit})

    @property
    def state(self):
        return self._state


class WordGameEnv(OpenEnvTextEnv):
    """The mapping by hooks: only the ``<answer>`` block is sent, and the prompt asks
    for that format."""

    def answer_to_action(self, answer: str) -> dict:
        match = re.search(r"<answer>(.*?)</answer>", answer, re.S)
        return {"word": match.group(1).strip() if match else ""}

    def observation_to_text(self, observation: dict) -> str:
        return observation["prompt"] + " Answer as <answer>word</answer>."


gym.register(id="WordGameRemote-v0", entry_point=WordGameEnv)


if __name__ == "__main__":
    import uvicorn
    from openenv.core.env_server.http_server import create_fastapi_app

    app = create_fastapi_app(WordGame, WordAction, WordObservation, max_concurrent_envs=8)
    port = int(sys.argv[sys.argv.index("--port") + 1])
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
