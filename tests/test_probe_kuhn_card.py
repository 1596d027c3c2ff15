"""bench/probe_kuhn_card.py: its labels, its prompts and its answer scores.

- The card rule it teaches, played as a strategy, is worth exactly the game's
  value against the Nash strategy (what its docstring claims the rule is for).
- Each first-turn prompt carries the card and the allowed actions its label was
  computed from, and the rule label is one of the allowed actions.
- The answer log-probability, which projects onto the vocabulary only at the
  answer's positions, equals the plain full-sequence computation on a small
  model, with rows of different lengths padded.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import kuhn_strategy  # noqa: E402
import probe_kuhn_card as probe  # noqa: E402
from conftest import tiny_config  # noqa: E402

from ragen_envs.games.rules import CARDS  # noqa: E402
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(*build_vocab())


def test_the_card_rule_is_worth_the_game_value_against_nash():
    counts = {}
    for seat in (0, 1):
        histories = [(), ("check", "bet")] if seat == 0 else [("check",), ("bet",)]
        for card in range(3):
            for moves in histories:
                facing = bool(moves) and moves[-1] == "bet"
                counts[(seat, card, moves)] = Counter({probe.RULE[card][facing]: 1})
    (first, second), unseen = kuhn_strategy.value_against_nash(counts)
    assert unseen == 0
    assert first == pytest.approx(-1 / 18) and second == pytest.approx(1 / 18)


def test_first_turns_label_the_card_shown_with_an_allowed_action(tokenizer):
    config = tiny_config(env="ragen/KuhnPoker-v0", max_turns=4)
    rows, prefill = probe.first_turns(config, tokenizer, 40, 0)
    assert prefill == "<think>"
    seen = Counter()
    for prompt, card, allowed, rule in rows:
        text = tokenizer.decode(prompt)
        assert f"Your card: {CARDS[card]}." in text
        facing = "Your opponent bet 1." in text
        assert allowed == (("call", "fold") if facing else ("check", "bet"))
        assert rule == probe.RULE[card][facing] and rule in allowed
        seen[(card, facing)] += 1
    assert len(seen) == 6  # every card, with and without a bet to face


def test_the_answer_follows_the_prefill_and_a_self_play_example_is_refused(tokenizer):
    full = tokenizer.decode(probe.answer_ids(tokenizer, "bet", "hm", ""))
    after = tokenizer.decode(probe.answer_ids(tokenizer, "bet", "hm", "<think>"))
    assert full.startswith("<think> hm </think> <answer> bet </answer>")
    assert after.startswith(" hm </think> <answer> bet </answer>")
    with pytest.raises(SystemExit, match="fixed-opponent"):
        probe.first_turns(
            tiny_config(env="ragen/KuhnPoker-v0", max_turns=4, self_play=True), tokenizer, 1, 0
        )


def test_answer_logprob_matches_the_full_computation():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).eval()
    pairs = [([1, 2, 3, 4, 5], [6, 7]), ([8, 9], [10, 11, 12]), ([3], [4])]
    got = probe.batch_logprob(model, pairs, pad=0)
    for row, (prompt, answer) in enumerate(pairs):
        ids = torch.tensor([prompt + answer])
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        want = sum(logp[len(prompt) - 1 + i, tok] for i, tok in enumerate(answer))
        assert got[row].item() == pytest.approx(want.item(), abs=1e-5)
