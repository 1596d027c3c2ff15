"""Tool calls parsed from a model's answer in the template's format; anything
malformed or hostile stays plain content, with its reason."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ragen_rllib.chat.tool_calls import parse_tool_calls, template_has_tool_calls


def call(name, **arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_calls_and_content_are_split():
    text = "Let me look.\n" + call("search", query="lake", k=3) + "\n" + call("open", doc=2)
    parsed = parse_tool_calls(text, {"search", "open"}, call_id="t7")
    assert parsed.error == "" and parsed.content == "Let me look."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["search", "open"]
    assert [c["id"] for c in parsed.tool_calls] == ["t7_0", "t7_1"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"query": "lake", "k": 3}
    message = parsed.message()
    assert message["role"] == "assistant" and len(message["tool_calls"]) == 2


def test_an_answer_with_no_call_is_content():
    parsed = parse_tool_calls("<answer>Left</answer>", {"search"})
    assert (parsed.content, parsed.tool_calls, parsed.error) == ("<answer>Left</answer>", [], "")
    assert "tool_calls" not in parsed.message()
    only_call = parse_tool_calls(call("search", query="x"), {"search"})
    assert only_call.content is None and len(only_call.tool_calls) == 1


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>{"name": "search"', "not closed"),
        ("<tool_call>{name: search}</tool_call>", "not JSON"),
        ("<tool_call>[1, 2]</tool_call>", "string 'name'"),
        ('<tool_call>{"name": 3}</tool_call>', "string 'name'"),
        ('<tool_call>{"name": "rm_rf"}</tool_call>', "did not offer"),
        ('<tool_call>{"name": "search", "arguments": "q"}</tool_call>', "'arguments' is not"),
        (call("search", q=1) + " and then", "after the last"),
        (call("search", q=1) + " x " + call("search", q=2), "between tool calls"),
        ("done</tool_call>", "without"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "not JSON"),
    ],
)
def test_malformed_calls_stay_plain_content_with_a_reason(text, reason):
    parsed = parse_tool_calls(text, {"search"})
    assert parsed.content == text and parsed.tool_calls == []
    assert reason in parsed.error


@given(st.text(max_size=400))
def test_any_text_parses_without_raising(text):
    parsed = parse_tool_calls(text, {"search"})
    if parsed.tool_calls:
        assert parsed.error == ""
    else:
        assert parsed.content == text


def test_the_format_is_read_off_the_template():
    assert template_has_tool_calls("{% if tools %}<tool_call>...{% endif %}")
    assert not template_has_tool_calls("{{ messages }}") and not template_has_tool_calls(None)
