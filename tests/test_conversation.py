"""The conversation recorder: an agent's chat requests become a trajectory whose
generated ids are exactly the engine's, whether the agent sends its history back as
returned (one growing segment, the answers never re-encoded) or re-renders it
differently (a new segment with its own context)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from ragen_rllib.agents.conversation import ConversationRecorder, same_answer
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.records.trajectory import Trajectory


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model("builtin"))


def rendered_ids(tok, messages, tools=None):
    kwargs = {"tools": tools} if tools else {}
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tok.encode(text, add_special_tokens=False)


def recorder(tok):
    return ConversationRecorder(tok, Trajectory(env_id="agent", seed=0, group=0))


def answer(rec, tok, ids, text, version=3, calls=None):
    reply = {"role": "assistant", "content": text}
    if calls:
        reply["tool_calls"] = calls
    logp = [-0.5] * len(ids)
    rec.record_answer(ids, logp, version, ended_with_eos=ids[-1] == tok.eos_token_id, reply=reply)
    return reply


def generated_ids(traj):
    """Every id with response mask 1, segment by segment."""
    return [
        [i for i, m in zip(s.input_ids, s.response_mask, strict=True) if m] for s in traj.segments
    ]


def test_a_history_sent_back_as_returned_extends_one_segment(tokenizer):
    tok, rec = tokenizer, recorder(tokenizer)
    first = [{"role": "user", "content": "You are on a lake. Where do you go?"}]
    ids1 = rec.prompt_ids(first)
    assert ids1 == rendered_ids(tok, first)
    a1 = tok.encode("I go left.", add_special_tokens=False) + [tok.eos_token_id]
    reply = answer(rec, tok, a1, "I go left.")
    second = [*first, reply, {"role": "user", "content": "You fell in a hole."}]
    ids2 = rec.prompt_ids(second)
    # The recorded ids, then the closing and the new message: here the same ids a
    # fresh rendering gives, since this answer encodes back to its own ids.
    assert ids2[: len(ids1) + len(a1)] == ids1 + a1
    assert ids2 == rendered_ids(tok, second)
    a2 = tok.encode("Up.", add_special_tokens=False) + [tok.eos_token_id]
    answer(rec, tok, a2, "Up.", version=4)
    traj = rec.trajectory
    assert rec.segments_started == 1 and len(traj.segments) == 1
    assert traj.segments[0].input_ids == ids2 + a2
    assert generated_ids(traj) == [a1 + a2]
    assert [traj.turn_ids(t) for t in range(2)] == [a1, a2]
    assert traj.segments[0].versions[len(ids1) : len(ids1) + len(a1)] == [3] * len(a1)
    assert traj.segments[0].versions[-len(a2) :] == [4] * len(a2)


def test_answer_ids_that_encode_differently_are_kept_as_sampled(tokenizer):
    tok, rec = tokenizer, recorder(tokenizer)
    word = "left"
    # The model spelled the word one character at a time: a valid sample whose text
    # encodes back to other (fewer) ids.
    spelled = [i for ch in word for i in tok.encode(ch, add_special_tokens=False)]
    assert spelled != tok.encode(word, add_special_tokens=False)
    first = [{"role": "user", "content": "Where?"}]
    ids1 = rec.prompt_ids(first)
    a1 = spelled + [tok.eos_token_id]
    reply = answer(rec, tok, a1, word)
    second = [*first, reply, {"role": "user", "content": "Again?"}]
    ids2 = rec.prompt_ids(second)
    assert ids2[: len(ids1) + len(a1)] == ids1 + a1  # not re-encoded
    assert ids2 != rendered_ids(tok, second)  # which a re-rendering would have done
    assert len(rec.trajectory.segments) == 1
    assert generated_ids(rec.trajectory) == [a1]


@pytest.mark.parametrize("change", ["edited answer", "dropped turn", "new tools", "new system"])
def test_a_history_rendered_differently_starts_a_segment(tokenizer, change):
    tok, rec = tokenizer, recorder(tokenizer)
    first = [{"role": "user", "content": "Turn 1"}]
    rec.prompt_ids(first)
    a1 = tok.encode("Right.", add_special_tokens=False) + [tok.eos_token_id]
    reply = answer(rec, tok, a1, "Right.")
    second = [*first, reply, {"role": "user", "content": "Turn 2"}]
    rec.prompt_ids(second)
    a2 = tok.encode("Down.", add_special_tokens=False) + [tok.eos_token_id]
    reply2 = answer(rec, tok, a2, "Down.")
    third = [*second, reply2, {"role": "user", "content": "Turn 3"}]
    tools = None
    if change == "edited answer":
        third[1] = {"role": "assistant", "content": "Right, I think."}
    elif change == "dropped turn":
        third = [first[0], {"role": "user", "content": "Turn 3"}]
    elif change == "new tools":
        tools = [{"type": "function", "function": {"name": "look", "parameters": {}}}]
    else:
        third = [{"role": "system", "content": "Be brief."}, *third]
    ids3 = rec.prompt_ids(third, tools)
    traj = rec.trajectory
    assert len(traj.segments) == 1  # nothing recorded before the answer
    a3 = tok.encode("Left.", add_special_tokens=False) + [tok.eos_token_id]
    answer(rec, tok, a3, "Left.")
    assert rec.segments_started == 2 and len(traj.segments) == 2
    why = "tools_changed" if change == "new tools" else "history_edited"
    assert rec.restarts == {why: 1}  # counted with its reason; the first is no restart
    # The new segment is the request as rendered, all context, then its answer; the
    # answers sampled before stay in the first segment exactly as sampled.
    assert traj.segments[1].input_ids == ids3 + a3
    assert ids3 == rendered_ids(tok, third, tools)
    assert generated_ids(traj) == [a1 + a2, a3]
    # Turns are answers; their rewards come with the agent's result.
    assert [span[0] for span in traj.turn_spans] == [0, 0, 1]


def test_a_template_that_rerenders_history_restarts_each_turn_and_says_so(tokenizer):
    """A template that drops earlier think blocks (as Qwen3's does) renders the last
    answer differently once a message follows it: every turn starts a segment, and
    each restart is counted as template_rerendered."""
    import copy

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = (
        "{% for m in messages %}{% set c = m['content'] %}"
        "{% if m['role'] == 'assistant' and not loop.last %}"
        "{% set c = c.split('</think>')[-1] %}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ c }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rec = recorder(tok)
    messages = [{"role": "user", "content": "Turn 1"}]
    for turn in range(3):
        rec.prompt_ids(messages)
        ids = tok.encode("<think> hm </think> Right.", add_special_tokens=False)
        reply = answer(rec, tok, [*ids, tok.eos_token_id], "<think> hm </think> Right.")
        messages = [*messages, reply, {"role": "user", "content": f"Turn {turn + 2}"}]
    assert rec.segments_started == 3
    assert rec.restarts == {"template_rerendered": 2}


def test_tool_calls_compare_by_name_and_parsed_arguments():
    returned = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "search", "arguments": '{"query": "lake", "k": 3}'}},
        ],
    }  # fmt: skip
    sent_back = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "other", "type": "function",
             "function": {"name": "search", "arguments": '{"k":3,"query":"lake"}'}},
        ],
    }  # fmt: skip
    assert same_answer(sent_back, returned)
    other = {**sent_back, "tool_calls": [{"function": {"name": "search", "arguments": "{}"}}]}
    assert not same_answer(other, returned)
    assert not same_answer({"role": "user", "content": None}, returned)
    parts = {
        "role": "assistant",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert same_answer(parts, {"role": "assistant", "content": "ab"})


def test_an_answer_needs_its_request(tokenizer):
    rec = recorder(tokenizer)
    with pytest.raises(RuntimeError, match="without a prompt_ids"):
        rec.record_answer([1], [0.0], 0, ended_with_eos=False, reply={"role": "assistant"})


def test_an_answer_cut_at_its_limit_is_closed_by_the_template(tokenizer):
    tok, rec = tokenizer, recorder(tokenizer)
    first = [{"role": "user", "content": "Count."}]
    ids1 = rec.prompt_ids(first)
    cut = tok.encode("one two three", add_special_tokens=False)  # no eos: the limit
    reply = {"role": "assistant", "content": "one two three"}
    rec.record_answer(cut, [-1.0] * len(cut), 0, ended_with_eos=False, reply=reply, cut=True)
    second = [*first, reply, {"role": "user", "content": "Go on."}]
    ids2 = rec.prompt_ids(second)
    # The template's whole closing (its end-of-turn token included) follows the cut
    # answer; here that is what a fresh rendering gives too.
    assert ids2[: len(ids1) + len(cut)] == ids1 + cut
    assert ids2 == rendered_ids(tok, second)
    assert rec.trajectory.turn_cut == [True]
