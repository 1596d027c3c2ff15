"""The two-armed bandit as an agent program: the `openai` client and the standard
library, nothing of this project.

``tuned_examples/bandit_agent_cpu.yaml`` trains it through the run's gateway;
``tuned_examples/bandit_cpu.yaml`` trains the gymnasium env ``ragen/Bandit-v0``
with the same prompt and payouts, the control. Dragon pays 1.0 with
probability 0.25 (0.25 on average), Phoenix 0.1 always: the better arm is the
one that usually pays nothing.

- ``run(base_url, api_key, task)``: one request, the reply's ``<answer>`` block
  names an arm, which pays; an answer that names no arm costs 0.1 (the env's
  format penalty). ``success``: it pulled Dragon.
- ``tasks(split)``: the two orders in which the arms are listed (the same for
  evaluation: a bandit has no questions to hold out).
"""

from __future__ import annotations

import random
import re

from openai import OpenAI

PAYS = {"dragon": lambda rng: 1.0 if rng.random() < 0.25 else 0.0, "phoenix": lambda rng: 0.1}
SYSTEM = "You are a helpful assistant. You first think, then answer."
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CLIENTS: dict[str, OpenAI] = {}


def client(base_url: str, api_key: str) -> OpenAI:
    """One client per server, copied per key: making an OpenAI client costs about 18 ms
    of CPU, a copy with another key about 20 us."""
    if base_url not in _CLIENTS:
        _CLIENTS[base_url] = OpenAI(base_url=base_url, api_key="-", max_retries=0)
    return _CLIENTS[base_url].with_options(api_key=api_key)


def tasks(split: str) -> list[dict]:
    return [{"arms": ["Dragon", "Phoenix"]}, {"arms": ["Phoenix", "Dragon"]}]


def prompt(arms: list[str]) -> str:
    names = ", ".join(arms)
    return (
        f"You face 2 slot-machine arms: {names}. Each pays a reward drawn from its own "
        "payout distribution, which you are not told. Pull the arm you expect to pay the "
        f"most on average.\nActions: the arm names ({names}). Answer with exactly one arm "
        "name. You have 1 action in total.\n\nTurn 1:\nState:\nArms: "
        f"{names}\nYou have 1 actions left. Always answer in the format <think> your "
        "thoughts </think> <answer> your actions </answer> and nothing else."
    )


def run(base_url: str, api_key: str, task: dict) -> dict:
    reply = client(base_url, api_key).chat.completions.create(
        model="policy",
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": prompt(task["arms"])},
        ],
    )
    found = _ANSWER.search(reply.choices[0].message.content or "")
    arm = found.group(1).strip().lower() if found else ""
    if arm not in PAYS:
        return {"reward": -0.1, "success": False}
    return {"reward": PAYS[arm](random.Random()), "success": arm == "dragon"}
