"""``loss_tokens: answer``: each answer's reasoning (up to and including ``</think>``)
leaves the loss, its action stays. The runner counts the reasoning's tokens on the
decoded text (so a tag split over several tokens counts whole), the learner
connector takes them out of the response mask after the advantages."""

from __future__ import annotations

import pytest
from conftest import tiny_config

from ragen_rllib.chat.prompts import THINK_END, reasoning_length
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.records.trajectory import Trajectory


def _check_count(tokenizer, prefill: str, ids: list[int], n: int) -> None:
    """``n`` is the fewest leading ids whose text closes the reasoning, or 0 when the
    text never does."""
    text = lambda k: prefill + tokenizer.decode(ids[:k], skip_special_tokens=True)  # noqa: E731
    if n == 0:
        assert THINK_END not in text(len(ids))
    else:
        assert THINK_END in text(n) and THINK_END not in text(n - 1)


@pytest.fixture(scope="module")
def builtin_tokenizer():
    from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab

    return build_tokenizer(*build_vocab())


@pytest.fixture(scope="module")
def smollm2_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.mark.parametrize("which", ["builtin", "smollm2"])
def test_the_reasoning_count_ends_with_the_closing_tag(which, request):
    tokenizer = request.getfixturevalue(f"{which}_tokenizer")
    answer = " go left </think> <answer> Left </answer>"
    ids = tokenizer.encode(answer, add_special_tokens=False)
    n = reasoning_length(tokenizer, "<think>", ids)
    assert 0 < n < len(ids)
    _check_count(tokenizer, "<think>", ids, n)
    # the rest is the answer: its text starts where the tag ended
    rest = tokenizer.decode(ids[n:], skip_special_tokens=True)
    assert "Left" in rest and "</answer>" in rest and "go" not in rest
    # never closed: no reasoning to take out; closed in the prefill: all answer
    open_ids = tokenizer.encode(" go left <answer> Left", add_special_tokens=False)
    assert reasoning_length(tokenizer, "<think>", open_ids) == 0
    assert reasoning_length(tokenizer, "<think> x </think>", ids) == 0
    assert reasoning_length(tokenizer, "<think>", []) == 0


def test_smollm2_splits_the_tag_and_the_count_still_covers_it(smollm2_tokenizer):
    """SmolLM2 has no single token for ``</think>``: the count covers all its pieces,
    and where a merge joins the tag's last piece to what follows ("><" is one of its
    tokens), that token counts as reasoning too."""
    tok = smollm2_tokenizer
    assert len(tok.encode(THINK_END, add_special_tokens=False)) > 1
    ids = tok.encode(" bet</think><answer>bet</answer>", add_special_tokens=False)
    n = reasoning_length(tok, "<think>", ids)
    _check_count(tok, "<think>", ids, n)
    assert tok.decode(ids[:n]) == " bet</think><"
    assert tok.decode(ids[n:]) == "answer>bet</answer>"


def _trajectory(reasoning: list[int]) -> Trajectory:
    """One segment: 3 context tokens, then per turn an answer of 5 tokens (the first
    ``reasoning[k]`` of them its reasoning) and 2 observation tokens."""
    t = Trajectory(env_id="x", seed=0, group=0)
    t.append_context([1, 2, 3])
    for _ in reasoning:
        t.append_generation([7] * 5, [-0.5] * 5)
        t.append_context([8, 9])
    t.turn_reasoning_tokens = list(reasoning)
    t.turn_rewards = [0.0] * (len(reasoning) - 1) + [1.0]
    t.turn_advantages = [1.0] * len(reasoning)
    return t


@pytest.mark.parametrize("loss_tokens", ["all", "answer"])
def test_the_reasoning_leaves_the_loss_and_keeps_its_advantage(loss_tokens):
    config = tiny_config(loss_tokens=loss_tokens)
    t = _trajectory([3, 0, 5])  # reasoning, none closed, all reasoning (cut at </think>)
    cols = build_learner_pipeline(config)(rl_module={}, batch={}, episodes=[t])["default_policy"]
    mask = cols["response_mask"][0].tolist()
    answers = [slice(3, 8), slice(10, 15), slice(17, 22)]
    kept = [sum(mask[s]) for s in answers]
    assert kept == ([5, 5, 5] if loss_tokens == "all" else [2, 5, 0])
    if loss_tokens == "answer":
        assert mask[3:6] == [0, 0, 0] and mask[6:8] == [1, 1]
    for s in answers:  # the advantages still cover every generated token
        assert all(a == 1.0 for a in cols["advantages"][0][s].tolist())
    assert "reasoning_mask" not in cols and "cut_mask" not in cols


def test_counts_out_of_step_with_the_turns_are_an_error():
    t = _trajectory([3, 6])  # 6 reasoning tokens in an answer of 5
    with pytest.raises(ValueError, match="turn 1 counts 6 reasoning tokens in an answer of 5"):
        build_learner_pipeline(tiny_config(loss_tokens="answer"))(
            rl_module={}, batch={}, episodes=[t]
        )


@pytest.mark.parametrize(
    "over, says",
    [
        ({"agent": "json:loads"}, "an agent program's answers are its own"),
        ({"advantage_estimator": "gae"}, "the value loss would skip them"),
        ({"advantage_estimator": "bilevel_gae"}, "use a critic-free estimator"),
    ],
)
def test_settings_it_cannot_work_with_are_refused(over, says):
    with pytest.raises(ValueError, match=f"config loss_tokens='answer' is invalid: .*{says}"):
        tiny_config(loss_tokens="answer", **over).check_values()
    tiny_config(loss_tokens="all", **{k: v for k, v in over.items() if k != "agent"}).check_values()


def test_the_batch_metrics_say_how_much_of_the_answers_is_trained():
    from ragen_rllib.env_runner.metrics import rollout_metrics

    a, b = _trajectory([3, 0]), _trajectory([5])
    out = rollout_metrics([a, b])
    assert out["loss_tokens/reasoning_closed_share"] == pytest.approx(2 / 3)
    assert out["loss_tokens/answer_token_share"] == pytest.approx(1 - 8 / 15)
    a.turn_reasoning_tokens, b.turn_reasoning_tokens = [], []  # loss_tokens: all
    assert not any(k.startswith("loss_tokens/") for k in rollout_metrics([a, b]))


def test_the_runner_counts_each_turns_reasoning_on_the_shipped_model():
    """The shipped built-in model writes the format: each turn's count closes its
    reasoning exactly, and the learner batch trains on the rest."""
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    config = tiny_config(
        llm="builtin", env="ragen/FrozenLakeNoSlip-v0", max_turns=3, loss_tokens="answer"
    )
    runner = LLMEnvRunner(config=config, worker_index=0)
    trajectories = runner.sample()
    counted = 0
    for t in trajectories:
        assert len(t.turn_reasoning_tokens) == len(t.turn_spans)
        for k, n in enumerate(t.turn_reasoning_tokens):
            _check_count(runner.tokenizer, t.prefill, t.turn_ids(k), n)
            counted += n > 0
    assert counted > 0, "the shipped model closed no reasoning"
    kept = build_learner_pipeline(config)(rl_module={}, batch={}, episodes=trajectories)
    total = sum(t.response_tokens for t in trajectories)
    reasoning = sum(sum(t.turn_reasoning_tokens) for t in trajectories)
    assert kept["default_policy"]["response_mask"].sum().item() == total - reasoning


def test_each_seat_counts_its_own_turns_in_self_play():
    """Self-play records each seat's turns in that seat's trajectory: its counts follow
    its own answers."""
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    config = tiny_config(
        env="ragen/TicTacToe-v0", self_play=True, group_size=4, max_turns=8,
        max_new_tokens=12, llm="builtin", minibatch_size=4, loss_tokens="answer",
    )  # fmt: skip
    runner = LLMEnvRunner(config=config, worker_index=0)
    try:
        trajectories = runner.run_episodes(
            [5] * 4 + [6] * 4, [0] * 4 + [1] * 4, SamplingParams(1.0, 1.0, 12), sample_seed=0
        )
    finally:
        runner.stop()
    seats = {t.turn_infos[0].get("seat") for t in trajectories if t.turn_infos}
    assert seats == {0, 1}
    counted = 0
    for t in trajectories:
        assert len(t.turn_reasoning_tokens) == len(t.turn_spans) > 0
        for k, n in enumerate(t.turn_reasoning_tokens):
            _check_count(runner.tokenizer, t.prefill, t.turn_ids(k), n)
            counted += n > 0
    assert counted > 0
