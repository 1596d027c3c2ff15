"""A question-answering agent with a search tool, written against the `openai` client.

It is the kind of program people already have: a loop around
``client.chat.completions.create``, with tools, its own prompt and its own
stopping rule. Trained unchanged by pointing it at the run's gateway
(``tuned_examples/search_agent_cpu.yaml``); the same task as a gymnasium env,
``ragen/SearchQA-v0``, is the control (``tuned_examples/searchqa_cpu.yaml``).

- ``run(base_url, api_key, task)``: asks the question, then each turn reads one
  command from the model's reply: a ``search`` or ``answer`` tool call, or, for a
  model whose chat template renders no tools (the built-in one), the same
  command written as text (``<answer>search: ...</answer>``). A search's best
  passages go back in the next message; an answer ends the loop with reward 1
  when it is right, else 0. A reply with no command costs 0.1, as the env's
  format penalty does.
- ``tasks(split)``: the questions of the search env's generated world; every
  sixth is held out for evaluation.

The search backend is the env's own BM25 index over the same passages, so the
agent and the control answer the same questions from the same search results.
"""

from __future__ import annotations

import json
import re

from openai import OpenAI

from ragen_envs.qa.qa_answers import normalize_text
from ragen_envs.qa.search_index import get_index, load_corpus, load_questions

MAX_TURNS = 5
MAX_SEARCHES = 4
TOP_K = 3
PASSAGE_CHARS = 300

SYSTEM = "You are a helpful assistant. You first think, then answer."
FORMAT = (
    "Always answer in the format <think> your thoughts </think> <answer> your actions "
    "</answer> and nothing else."
)
INSTRUCTIONS = (
    "Answer the question with the help of a search engine over a collection of "
    "encyclopedia passages. The facts you need are in the passages, not in your "
    "memory; a question may need two searches, the second for a name the first passage "
    "gives. Each turn, write exactly one command in the answer block:\n"
    "- <answer>search: Ilsa Marrow</answer> shows the 3 passages that best match the "
    "query (keyword search: use names and key words);\n"
    "- <answer>answer: Karsk</answer> gives your final answer, a short name, and ends "
    "the episode.\n"
    f"You have {MAX_SEARCHES} searches and {MAX_SEARCHES + 1} commands in all. Reward 1 "
    "when the answer is right (case and punctuation do not matter)."
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": what,
            "parameters": {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
        },
    }
    for name, what in (
        ("search", "Keyword search over the passages; shows the best 3."),
        ("answer", "Give the final answer, a short name; ends the episode."),
    )
]
_ANSWER_BLOCK = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CLIENTS: dict[str, OpenAI] = {}


def client_for(base_url: str, api_key: str) -> OpenAI:
    """One client per server, copied per key: making an OpenAI client costs about 18 ms
    of CPU, a copy with another key about 20 us."""
    if base_url not in _CLIENTS:
        _CLIENTS[base_url] = OpenAI(base_url=base_url, api_key="-", max_retries=0)
    return _CLIENTS[base_url].with_options(api_key=api_key)


def tasks(split: str) -> list[dict]:
    """The generated world's questions: every sixth for ``eval``, the rest for ``train``."""
    questions = load_questions(None, load_corpus(None))
    held_out = split == "eval"
    return [
        {"question": q.question, "answers": list(q.answers)}
        for i, q in enumerate(questions)
        if (i % 6 == 5) == held_out
    ]


def command_of(message) -> tuple[str, str, str | None]:
    """(command, argument, tool call id) of a reply: its first tool call, else the
    ``command: argument`` in its answer block; ("", "", None) when there is none."""
    if message.tool_calls:
        call = message.tool_calls[0]
        try:
            argument = json.loads(call.function.arguments).get("text", "")
        except (json.JSONDecodeError, AttributeError):
            argument = ""
        return call.function.name, str(argument), call.id
    found = _ANSWER_BLOCK.search(message.content or "")
    word, colon, argument = (found.group(1) if found else "").partition(":")
    if not colon:
        return "", "", None
    return word.strip().lower(), " ".join(argument.split()), None


def search(query: str) -> str:
    hits = get_index(load_corpus(None)).search(query, TOP_K)
    lines = [f"[{i}] {p.title} | {p.text[:PASSAGE_CHARS]}" for i, (p, _) in enumerate(hits, 1)]
    return "\n".join(lines) or "No passage matches."


def run(base_url: str, api_key: str, task: dict) -> dict:
    client = client_for(base_url, api_key)
    question = f"Question: {task['question']}"
    searches = 0
    penalties: list[float] = []  # one per model call, as the reward's turn_rewards
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{INSTRUCTIONS}\n\nTurn 1:\nState:\n{question}\n{FORMAT}"},
    ]
    for turn in range(1, MAX_TURNS + 1):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        sent = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            sent["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        messages.append(sent)
        command, argument, call_id = command_of(message)
        penalties.append(0.0)
        if command == "answer" and argument:
            given = normalize_text(argument)
            right = bool(given) and given in {normalize_text(a) for a in task["answers"]}
            return {"reward": 1.0 if right else 0.0, "turn_rewards": penalties, "success": right}
        if command == "search" and argument and searches < MAX_SEARCHES:
            searches += 1
            note = search(argument)
        else:
            penalties[-1] = -0.1
            note = "Refused: start with 'search:' or 'answer:'."
        state = f"{note}\n{question}\nSearches left: {MAX_SEARCHES - searches}."
        text = f"Turn {turn + 1}:\nState:\n{state}\n{FORMAT}"
        if call_id is not None:  # a tool call is answered by a tool message
            messages.append({"role": "tool", "tool_call_id": call_id, "content": state})
        else:
            messages.append({"role": "user", "content": text})
    return {"reward": 0.0, "turn_rewards": penalties, "success": False}
