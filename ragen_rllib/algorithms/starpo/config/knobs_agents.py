"""The agents room's knobs (``agents/``): an agent program in place of the env, its tasks,
where its calls run and how they end, and the chat completions gateway it talks to the
policy through (docs/agents.md)."""

from __future__ import annotations

import re

from ragen_rllib.algorithms.starpo.config.knob import Knob, knobs
from ragen_rllib.algorithms.starpo.config.rules import (
    checked_elsewhere,
    choice,
    custom,
    integer,
    number,
)

K = Knob

AGENT = knobs(
    "agent programs",
    K(
        "agent",
        None,
        checked_elsewhere("must be null or 'module:function' / 'path/to/file.py:function'"),
        "an agent program in place of the env: run(base_url, api_key, task) talks to the "
        "policy through chat completions and returns its reward (docs/agents.md)",
        cross=True,
    ),
    K(
        "agent_tasks",
        None,
        checked_elsewhere(
            "must be null, or with agent 'module:function' (called with 'train' or 'eval') "
            "or a .jsonl file of task records"
        ),
        "the agent's tasks: tasks(split) -> records, or a .jsonl file (records with "
        '"split": "eval" held out for evaluation)',
        cross=True,
    ),
    K(
        "agent_timeout_s",
        300.0,
        number(0, 86400, low_open=True),
        "an agent call that has not returned by then fails (its group is dropped)",
    ),
    K(
        "agent_isolation",
        "thread",
        choice(("thread", "process")),
        "where an agent call runs: a thread (cheapest; a hung agent's thread is left "
        "running, counted as agents/hung_threads) or a worker process killed at "
        "agent_timeout_s (agents/agents_killed)",
    ),
    K(
        "agent_max_hung_threads",
        32,
        integer(1, 100000),
        "with agent_isolation: thread, hung agent threads at most: once a runner has "
        "this many, its later agent calls run in worker processes, as with "
        "agent_isolation: process (logged once; counted as agents/process_calls)",
    ),
    K(
        "agent_max_abs_reward",
        1.0e6,
        number(0, None, low_open=True),
        "an agent's reward (or turn reward, or their sum) beyond +-this is refused: the "
        "trajectory fails and is counted (agents/rewards_refused)",
    ),
    K(
        "agent_gateway_host",
        "127.0.0.1",
        custom(
            lambda v: isinstance(v, str) and bool(re.fullmatch(r"[A-Za-z0-9.\-]+", v)),
            "must be a host name or IPv4 address, such as 127.0.0.1 or 0.0.0.0",
        ),
        "where the agents' chat completions gateway listens (anything but loopback is "
        "reachable by others: the header says so)",
    ),
    K(
        "agent_max_tokens_over_limit",
        "clamp",
        choice(("clamp", "refuse")),
        "an agent's max_tokens above max_new_tokens: clamped to it (counted), or refused (400)",
    ),
    K(
        "agent_gateway_url",
        None,
        custom(
            lambda v: v is None or (isinstance(v, str) and bool(re.fullmatch(r"https?://\S+", v))),
            "must be null or an http(s) URL such as http://gateway.internal:{port}/v1",
        ),
        "the base URL agents are given, {port} filled in (a proxy, a name); null: "
        "http://<agent_gateway_host>:<port>/v1, this machine's address for 0.0.0.0",
    ),
    K(
        "agent_gateway_max_connections",
        1024,
        integer(8),
        "the gateway's open connections at most (lowered to fit half the process's "
        "open-file limit); at the cap a new connection replaces one still without its "
        "request headers",
    ),
    K(
        "agent_gateway_header_timeout_s",
        10.0,
        number(0, 3600, low_open=True),
        "a gateway connection whose request headers are not complete by then is closed",
    ),
    K(
        "agent_gateway_body_timeout_s",
        30.0,
        number(0, 3600, low_open=True),
        "a gateway request whose body is not complete by then gets 408",
    ),
)

ALL = AGENT
