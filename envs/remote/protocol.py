"""The wire types of a ragen text env served over OpenEnv, and a typed OpenEnv client.

Needs the ``openenv`` extra (``pip install 'ragen-rllib[openenv]'``, which pins
``openenv==0.10.0``). :mod:`ragen_envs.remote.serve` serves these types;
:mod:`ragen_envs.remote.client` reads them as plain JSON, so a training process needs
this module only through the OpenEnv client it uses.

One turn on the wire (OpenEnv's WebSocket session at ``/ws``; the JSON shown is
what :class:`~openenv.core.GenericEnvClient` sends and receives)::

    -> {"type": "reset", "data": {"seed": 7}}
    <- {"type": "observation", "data": {"observation": {"text": "...", "terminated": false,
        "truncated": false, "info": {...}, "instructions": "...", "metadata": {}},
        "reward": 0.0, "done": false}}
    -> {"type": "step", "data": {"answer": "<think>...</think><answer>Up</answer>"}}
    <- {"type": "observation", "data": {"observation": {...}, "reward": -0.1, "done": false}}

``done`` is ``terminated or truncated``; the two are sent apart because the
trainer tells them apart. ``info`` holds the gymnasium env's info dict made
JSON-safe (tuples become lists, numpy scalars plain numbers).
"""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

#: The OpenEnv release this protocol is written and tested against (setup.cfg pins it).
OPENENV_VERSION = "0.10.0"


class AnswerAction(Action):
    """One turn: the model's raw answer text, parsed by the env and never executed."""

    answer: str = Field(description="The model's answer text, exactly as generated")


class TextObservation(Observation):
    """What a text env returns from ``reset()`` and ``step()``."""

    text: str = Field(description="The env's text observation")
    terminated: bool = Field(default=False, description="The episode reached its end")
    truncated: bool = Field(default=False, description="The episode was cut (budget, turns)")
    info: dict[str, Any] = Field(default_factory=dict, description="The env's info dict")
    instructions: str | None = Field(
        default=None,
        description="The env's instructions() in its configured style (reset only; "
        "null for an env without instructions)",
    )


class TextEnvState(State):
    """``state()``: the episode's id and step count (OpenEnv's), plus the env id."""

    env_id: str = Field(default="", description="The gymnasium id the server plays")
    done: bool = Field(default=True, description="No episode is running")


class RagenEnvClient(EnvClient[AnswerAction, TextObservation, TextEnvState]):
    """A typed OpenEnv client for a ``python -m ragen_envs.remote.serve`` server::

    with RagenEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        result = client.reset(seed=7)
        result = client.step(AnswerAction(answer="<answer>Up</answer>"))
        print(result.observation.text, result.reward, result.done)
    """

    def _step_payload(self, action: AnswerAction) -> dict[str, Any]:
        return {"answer": action.answer}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[TextObservation]:
        fields = dict(payload.get("observation", {}))
        fields.update(done=payload.get("done", False), reward=payload.get("reward"))
        return StepResult(
            observation=TextObservation(**fields),
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> TextEnvState:
        return TextEnvState(**payload)
