"""A number-guessing agent written with LangChain: nothing of this project.

It uses LangChain's chat model for OpenAI-compatible servers
(``langchain_openai.ChatOpenAI``, ``pip install langchain-openai``) and its
message types, as an agent built on LangChain would; pointed at the run's
gateway it is trained unchanged (``tuned_examples/guess_agent_cpu.yaml``).

- ``run(base_url, api_key, task)``: the model guesses a hidden number from 1 to
  8 in at most 3 turns; after a wrong guess it hears "higher" or "lower". Each
  answer is cut by the stop sequence ``</answer>`` (the gateway's engine stops
  there), and the guess is the number after ``<answer>``. Reward 1 when it finds
  the number; a reply with no number costs 0.1 (as the envs' format penalty).
  ``success``: it found the number.
- ``tasks(split)``: the 8 numbers (the same for evaluation: the game has no
  questions to hold out).
"""

from __future__ import annotations

import re

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

LOW, HIGH, TURNS = 1, 8, 3
STOP = "</answer>"
SYSTEM = "You are a helpful assistant. You first think, then answer."
_GUESS = re.compile(r"<answer>\s*(\d+)")


def tasks(split: str) -> list[dict]:
    return [{"number": n} for n in range(LOW, HIGH + 1)]


def prompt() -> str:
    return (
        f"I am thinking of a whole number from {LOW} to {HIGH}. Guess it: after a wrong "
        f"guess I say whether it is higher or lower. You have {TURNS} guesses.\n"
        "Always answer in the format <think> your thoughts </think> <answer> one number "
        "</answer> and nothing else."
    )


def run(base_url: str, api_key: str, task: dict) -> dict:
    model = ChatOpenAI(base_url=base_url, api_key=api_key, model="policy", max_retries=0)
    history = [SystemMessage(SYSTEM), HumanMessage(prompt())]
    reward = 0.0
    for turn in range(TURNS):
        reply = model.invoke(history, stop=[STOP])
        history.append(reply)
        found = _GUESS.search(reply.text)
        left = TURNS - turn - 1
        if found is None:
            reward -= 0.1
            said = "Answer with one number in the answer block."
        elif int(found.group(1)) == task["number"]:
            return {"reward": reward + 1.0, "success": True}
        else:
            said = "Higher." if task["number"] > int(found.group(1)) else "Lower."
        if left:
            history.append(HumanMessage(f"{said} You have {left} guesses left."))
    return {"reward": reward, "success": False}
