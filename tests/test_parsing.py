"""The answer parser: accepted shapes, rejected shapes, and properties on arbitrary text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen_envs.core.parsing import ParserConfig, parse_answer

NAMES = ("Up", "Down", "Left", "Right")


def test_well_formed_answer():
    p = parse_answer("<think>go left</think><answer>Left || up||DOWN</answer>", NAMES)
    assert p.format_ok and p.is_valid
    assert p.think == "go left"
    assert p.actions == ("Left", "Up", "Down")
    assert p.invalid == () and p.num_dropped == 0


def test_whitespace_around_tags_is_allowed():
    p = parse_answer("  \n<think> a </think>\n <answer> Right </answer>\n", NAMES)
    assert p.is_valid and p.actions == ("Right",)


def test_unknown_actions_are_dropped_and_reported():
    p = parse_answer("<think></think><answer>Up || Jump || left</answer>", NAMES)
    assert p.format_ok and not p.is_valid
    assert p.actions == ("Up", "Left")
    assert p.invalid == ("Jump",)


def test_actions_beyond_the_turn_limit_are_cut_without_penalty():
    cfg = ParserConfig(max_actions=2)
    p = parse_answer("<think>x</think><answer>Up||Up||Up||Left</answer>", NAMES, cfg)
    assert p.actions == ("Up", "Up") and p.num_dropped == 2 and p.is_valid


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Up",
        "<answer>Up</answer>",  # think required by default
        "<think>x</think>",
        "<think>x</think><answer></answer>",
        "<think>x</think><answer> || </answer>",
        "<think>x</think><answer>Up</answer><answer>Up</answer>",
        "<think>x</think><think>y</think><answer>Up</answer>",
        "<think>x<answer>Up</answer></think>",
        "<answer>Up</answer><think>x</think>",
        "<think>x</think></answer>Up<answer>",
        "hello <think>x</think><answer>Up</answer>",
        "<think>x</think> between <answer>Up</answer>",
        "<think>x</think><answer>Up</answer> trailing",
        "<think>x</think><answer>Up",
        "<think><think>x</think></think><answer>Up</answer>",
    ],
)
def test_broken_structure_is_a_format_failure_with_no_actions(text):
    p = parse_answer(text, NAMES)
    assert not p.format_ok and not p.is_valid
    assert p.actions == ()
    assert p.error


def test_think_optional_when_not_required():
    cfg = ParserConfig(require_think=False)
    assert parse_answer("<answer>Up</answer>", NAMES, cfg).actions == ("Up",)
    assert parse_answer("<think>a</think><answer>Up</answer>", NAMES, cfg).actions == ("Up",)
    assert not parse_answer("x <answer>Up</answer>", NAMES, cfg).format_ok


def test_custom_separator():
    cfg = ParserConfig(separator=",")
    p = parse_answer("<think>t</think><answer>Up, Left</answer>", NAMES, cfg)
    assert p.actions == ("Up", "Left")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"separator": ""}, "separator"),
        ({"separator": "<"}, "separator"),
        ({"max_actions": 0}, "max_actions"),
    ],
)
def test_bad_parser_config_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ParserConfig(**kwargs)


def test_megabyte_inputs_parse_quickly_and_fail_cleanly():
    big = "<think>" * 200_000 + "é" * 1_000_000
    assert not parse_answer(big, NAMES).format_ok
    body = " || ".join(["Up"] * 200_000)
    p = parse_answer(f"<think>{'x' * 1_000_000}</think><answer>{body}</answer>", NAMES)
    assert p.format_ok and p.actions == ("Up",) * 5 and p.num_dropped == 200_000 - 5


# ----- properties -------------------------------------------------------------
TAGS = ["<think>", "</think>", "<answer>", "</answer>", "||"]
fragments = st.one_of(st.sampled_from(TAGS + list(NAMES)), st.text(max_size=20))


@settings(max_examples=400, deadline=None)
@given(st.text())
def test_never_raises_on_arbitrary_text(text):
    p = parse_answer(text, NAMES)
    assert set(p.actions) <= set(NAMES)
    assert p.is_valid == (p.format_ok and not p.invalid)


@settings(max_examples=400, deadline=None)
@given(st.lists(fragments, max_size=30).map("".join))
def test_never_raises_on_tag_soup(text):
    p = parse_answer(text, NAMES)
    if not p.format_ok:
        assert p.actions == ()


token = st.one_of(
    st.sampled_from(NAMES),
    st.sampled_from(["up", "LEFT", " right "]),
    st.text(alphabet=st.characters(blacklist_characters="|<>"), max_size=8),
)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.characters(blacklist_characters="<>"), max_size=30),
    st.lists(token, min_size=1, max_size=8),
)
def test_valid_structure_keeps_exactly_the_known_actions(think, tokens):
    text = f"<think>{think}</think><answer>{' || '.join(tokens)}</answer>"
    p = parse_answer(text, NAMES)
    stripped = [t.strip() for t in tokens if t.strip()]
    known = [t for t in stripped if t.lower() in {n.lower() for n in NAMES}]
    assert p.format_ok == bool(stripped)
    if stripped:
        assert [a.lower() for a in p.actions] == [k.lower() for k in known][:5]
        assert len(p.invalid) == len(stripped) - len(known)
