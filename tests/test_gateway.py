"""The chat completions gateway over a real HTTP server and the real HF engine (the
built-in model): the ``openai`` client's requests are answered and recorded token-in,
token-out; hostile and out-of-limit requests get clear 4xx errors and leave no trace;
64 agents at once are all answered, in shared engine batches, nothing lost."""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from ragen_rllib.agents.gateway import Gateway, GatewayError, GatewayLimits
from ragen_rllib.engines.hf_engine import HFEngine
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.records.trajectory import Trajectory

LIMITS = GatewayLimits(
    model="builtin", temperature=1.0, top_p=1.0, max_new_tokens=12, max_context_tokens=400,
    max_body_bytes=64 * 1024,
)  # fmt: skip


@pytest.fixture(scope="module")
def gateway():
    path = resolve_model("builtin")
    tok = AutoTokenizer.from_pretrained(path)
    engine = HFEngine(path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    gw = Gateway(engine, tok, LIMITS, seed=0)
    gw.base_url = gw.serve()
    yield gw
    gw.shutdown()


def traj(group=0):
    return Trajectory(env_id="agent", seed=group, group=group)


def test_an_openai_client_conversation_is_recorded_token_in_token_out(gateway):
    key = gateway.open(traj())
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["builtin"]
    messages = [{"role": "user", "content": "You are on a frozen lake. Go."}]
    usage = []
    for turn in range(3):
        out = client.chat.completions.create(model="builtin", messages=messages, max_tokens=8)
        choice = out.choices[0]
        assert choice.finish_reason in ("stop", "length")
        usage.append(out.usage)
        # The message goes back as the client returned it (its extra null fields too).
        messages += [choice.message.model_dump(), {"role": "user", "content": f"Turn {turn}"}]
    trajectory, answered = gateway.close(key)
    assert answered == 3 and len(trajectory.segments) == 1 and len(trajectory.turn_spans) == 3
    seg = trajectory.segments[0]
    for t, u in enumerate(usage):
        ids = trajectory.turn_ids(t)
        assert len(ids) == u.completion_tokens
        _, start, _ = trajectory.turn_spans[t]
        assert start == u.prompt_tokens  # each prompt is the whole sequence before it
        assert all(v == 0 for v in seg.versions[start : start + len(ids)])
    with pytest.raises(openai.ConflictError, match="finished"):
        client.chat.completions.create(model="builtin", messages=messages)


def test_a_rerendered_history_opens_a_segment_over_http(gateway):
    key = gateway.open(traj())
    client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
    first = [{"role": "user", "content": "Where to?"}]
    a = client.chat.completions.create(model="m", messages=first).choices[0].message
    edited = [*first, {"role": "assistant", "content": a.content + " (edited)"},
              {"role": "user", "content": "And now?"}]  # fmt: skip
    client.chat.completions.create(model="m", messages=edited)
    trajectory, _ = gateway.close(key)
    assert len(trajectory.segments) == 2
    assert [span[0] for span in trajectory.turn_spans] == [0, 1]


def post(gateway, key, body, raw=False):
    content = body if raw else json.dumps(body).encode()
    return httpx.post(
        gateway.base_url + "/chat/completions",
        content=content,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        timeout=60,
    )


OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"{not json", 400, "not JSON"),
        ({**OK, "frobnicate": 1}, 400, "frobnicate"),
        ({**OK, "messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
        ({**OK, "messages": []}, 400, "empty"),
        ({**OK, "temperature": 0.2}, 400, "temperature 1.0"),
        ({**OK, "top_p": 1.5}, 400, "top_p"),
        ({**OK, "max_tokens": 10_000}, 400, "1 to 12"),
        ({**OK, "n": 3}, 400, "n=3"),
        ({**OK, "stream": True}, 400, "stream"),
        ({**OK, "messages": [{"role": "user", "content": "lake " * 2000}]}, 400, "max_context"),
        ({**OK, "messages": [{"role": "user", "content": "x" * 70_000}]}, 413, "over"),
        (b'{"model": "m", "messages": ' + b"[" * 30_000, 400, "not JSON"),
        (b'{"model": "m", "max_tokens": ' + b"9" * 5_000 + b"}", 400, "not JSON"),
        (b'{"model": "\xff\xfe"}', 400, "not JSON"),
        ({**OK, "tools": [{"type": "function", "function": "search"}]}, 400, "tools"),
        ({**OK, "tools": [{"type": "function", "function": {"name": ["a"]}}]}, 400, "name"),
        ({**OK, "max_completion_tokens": 0}, 400, "1 to 12"),
    ],
)
def test_bad_requests_get_a_clear_4xx_and_leave_no_trace(gateway, body, status, says):
    key = gateway.open(traj())
    response = post(gateway, key, body, raw=isinstance(body, bytes))
    assert response.status_code == status, response.text
    assert says in response.json()["error"]["message"]
    trajectory, answered = gateway.close(key)
    assert answered == 0 and trajectory.segments == []


def test_overflow_says_its_code(gateway):
    key = gateway.open(traj())
    body = {**OK, "messages": [{"role": "user", "content": "lake " * 2000}]}
    assert post(gateway, key, body).json()["error"]["code"] == "context_length_exceeded"


def test_keys_name_trajectories(gateway):
    assert post(gateway, "made-up", OK).status_code == 401
    # The key is checked before the body is read: no 413 for a stranger.
    big = {**OK, "messages": [{"role": "user", "content": "x" * 70_000}]}
    assert post(gateway, "made-up", big).status_code == 401
    key = gateway.open(traj())
    gateway.close(key)
    assert post(gateway, key, big).status_code == 409
    no_auth = httpx.post(gateway.base_url + "/chat/completions", json=OK, timeout=60)
    assert no_auth.status_code == 401
    assert httpx.get(gateway.base_url + "/models", timeout=60).status_code == 401


def test_64_agents_at_once_are_all_answered_in_shared_batches(gateway):
    keys = [gateway.open(traj(g)) for g in range(64)]
    before = len(gateway._batcher.batches)
    errors = []

    def agent(key):
        try:
            client = openai.OpenAI(base_url=gateway.base_url, api_key=key, max_retries=0)
            messages = [{"role": "user", "content": "Go."}]
            for turn in range(2):
                m = client.chat.completions.create(model="m", messages=messages).choices[0]
                messages += [m.message.model_dump(), {"role": "user", "content": str(turn)}]
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=agent, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]
    results = [gateway.close(k) for k in keys]
    assert all(n == 2 and len(t.turn_spans) == 2 and len(t.segments) == 1 for t, n in results)
    batches = gateway._batcher.batches[before:]
    assert sum(batches) == 128 and max(batches) > 1, batches


class FailingEngine(HFEngine):
    """The built-in model's engine, made to fail every generation."""

    def _generate(self, request):
        raise RuntimeError("out of memory (injected)")


def test_an_engine_failure_is_a_503_and_records_nothing():
    path = resolve_model("builtin")
    tok = AutoTokenizer.from_pretrained(path)
    engine = FailingEngine(path, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    gw = Gateway(engine, tok, LIMITS)
    try:
        key = gw.open(traj())
        with pytest.raises(GatewayError, match="injected") as err:
            gw.complete(key, json.dumps(OK).encode())
        assert err.value.status == 503
        trajectory, answered = gw.close(key)
        assert answered == 0 and trajectory.segments == []
        assert gw.counts["refused_503"] == 1
    finally:
        gw.shutdown()
