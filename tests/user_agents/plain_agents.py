"""Agent programs as a user writes them: the `openai` client (or raw HTTP) and the
standard library, nothing of ragen_rllib. Each task's ``mode`` picks a behaviour,
so one batch can hold healthy and failing agents."""

from __future__ import annotations

import json
import time
import urllib.request

from openai import AsyncOpenAI, OpenAI

SYSTEM = "You are a helpful assistant. You first think, then answer."


def tasks(split: str) -> list[dict]:
    if split == "eval":
        return [{"mode": "talk", "word": "left", "turns": 1}]
    return [
        {"mode": "talk", "word": "left", "turns": 2},
        {"mode": "talk", "word": "up", "turns": 2},
    ]


def _messages(task: dict) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Say {task['word']}. <answer> your word </answer>"},
    ]


def talk(base_url: str, api_key: str, task: dict) -> dict:
    """``turns`` requests, each history the last one's plus its answer plus a new
    message; reward 1 when the last answer holds the word, a per-turn 0.5 bonus for
    every answer that has an answer block."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = _messages(task)
    bonus = []
    text = ""
    for _ in range(task.get("turns", 1)):
        reply = client.chat.completions.create(model="policy", messages=messages)
        text = reply.choices[0].message.content or ""
        bonus.append(0.5 if "<answer>" in text else 0.0)
        messages += [
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Again."},
        ]
    return {"reward": float(task["word"] in text), "turn_rewards": bonus}


def run(base_url: str, api_key: str, task: dict):
    """Dispatch on the task's mode: talk, async, http, edit, raise, hang, silent, bad."""
    mode = task.get("mode", "talk")
    if mode == "talk":
        return talk(base_url, api_key, task)
    if mode == "async":
        return talk_async(base_url, api_key, task)  # a coroutine: the runner awaits it
    if mode == "http":  # raw HTTP, no client library
        body = json.dumps({"model": "policy", "messages": _messages(task)}).encode()
        request = urllib.request.Request(
            f"{base_url}/chat/completions",
            data=body,
            headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            reply = json.load(response)
        return 1.0 if task["word"] in reply["choices"][0]["message"]["content"] else 0.0
    if mode == "edit":
        return edit(base_url, api_key, task)
    if mode == "raise":
        raise RuntimeError("the agent's own bug")
    if mode == "hang":
        time.sleep(task.get("seconds", 30))
        return 1.0
    if mode == "silent":
        return 1.0  # never asked the model
    if mode == "bad":
        talk(base_url, api_key, {**task, "turns": 1})
        return "great"
    raise ValueError(f"unknown mode {mode!r}")


async def talk_async(base_url: str, api_key: str, task: dict) -> float:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = await client.chat.completions.create(model="policy", messages=_messages(task))
    return float(task["word"] in (reply.choices[0].message.content or ""))


def edit(base_url: str, api_key: str, task: dict) -> dict:
    """Three requests; the third rewrites the history (the first answer replaced by a
    summary), so it cannot extend the recorded ids."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = _messages(task)
    texts = []
    for turn in range(3):
        if turn == 2:
            messages = [*_messages(task), {"role": "user", "content": f"Earlier: {texts[0][:20]}"}]
        reply = client.chat.completions.create(model="policy", messages=messages)
        texts.append(reply.choices[0].message.content or "")
        messages = [*messages, {"role": "assistant", "content": texts[-1]},
                    {"role": "user", "content": "Again."}]  # fmt: skip
    return 0.0
