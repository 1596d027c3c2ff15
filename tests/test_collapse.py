"""Collapse indicators on constructed inputs: the MI estimate and retrieval accuracy
at their two extremes, distinct-n and template repetition on hand-made texts, and
the early-warning rule on hand-made signal streams. No Ray."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import built_learner

from ragen_rllib.maths.collapse import (
    EarlyWarning,
    distinct_n,
    distinct_n_within_groups,
    own_reasoning,
    pair_information,
    template_repetition,
)

M = 8


def test_mi_is_log_m_when_each_reasoning_names_its_prompt():
    # Reasoning j is certain under prompt j and very unlikely under any other.
    loglik = torch.full((M, M), -60.0)
    loglik.fill_diagonal_(0.0)
    info = pair_information(loglik, [5] * M, k=3)
    assert info.mutual_information == pytest.approx(math.log(M), abs=1e-6)
    assert info.retrieval_acc_at_1 == 1.0 and info.retrieval_acc_at_k == 1.0
    assert info.chance_at_1 == pytest.approx(1 / M)
    assert info.conditional_entropy == pytest.approx(0.0)
    # Matched pairs stand far above mismatched ones: z is large (std of equal values
    # is 0, so a tiny spread is added to make it finite).
    loglik2 = loglik + torch.linspace(0, 1e-3, M)[:, None]
    loglik2.fill_diagonal_(0.0)
    assert pair_information(loglik2, [5] * M).mi_zscore > 1e3


def test_mi_is_zero_when_reasoning_ignores_the_prompt():
    g = torch.Generator().manual_seed(0)
    per_reasoning = -torch.rand(M, generator=g) * 20  # log p(z_j), whatever the prompt
    loglik = per_reasoning[None, :].repeat(M, 1)
    info = pair_information(loglik, [4] * M, k=3)
    assert info.mutual_information == pytest.approx(0.0, abs=1e-9)
    assert info.mi_zscore == 0.0
    # Every prompt ties: the own prompt is never strictly best, retrieval is at or
    # below chance.
    assert info.retrieval_acc_at_1 <= 1 / M
    assert info.conditional_entropy == pytest.approx(-float(per_reasoning.sum()) / (4 * M))


def test_retrieval_is_at_chance_for_random_scores():
    g = torch.Generator().manual_seed(1)
    hits1 = hitsk = 0
    trials = 400
    for _ in range(trials):
        info = pair_information(torch.randn(M, M, generator=g), [3] * M, k=2)
        hits1 += info.retrieval_acc_at_1
        hitsk += info.retrieval_acc_at_k
    # 400 x 8 draws: chance 1/8 and 2/8, within 4 standard errors.
    se1 = math.sqrt((1 / M) * (1 - 1 / M) / (trials * M))
    assert abs(hits1 / trials - 1 / M) < 4 * se1
    assert abs(hitsk / trials - 2 / M) < 4 * math.sqrt((2 / M) * (1 - 2 / M) / (trials * M))


def test_pair_information_rejects_bad_shapes():
    with pytest.raises(ValueError, match="square"):
        pair_information(torch.zeros(2, 3), [1, 1])
    with pytest.raises(ValueError, match="positive counts"):
        pair_information(torch.zeros(2, 2), [1, 0])


def test_own_reasoning_distinct_n_and_template_repetition_on_hand_made_texts():
    # The model's own text up to </think>, tags removed, never the prefill's words.
    answer = "<think> go up then left </think> <answer> Up </answer>"
    assert own_reasoning(answer) == "go up then left"
    assert own_reasoning(answer, prefill="<think>") == "go up then left"
    assert own_reasoning("<think> cut short", prefill="<think>") == "cut short"
    # A prefill that closes the think block leaves the model its answer only.
    fixed = "<think> go </think> <answer>"
    assert own_reasoning(fixed + " Up || Left </answer>", prefill=fixed) == "Up || Left"
    assert own_reasoning(fixed + " </answer>", prefill=fixed) == ""
    texts = ["a b c", "a b d"]
    # unigrams: a b c a b d -> {a, b, c, d} / 6; bigrams: ab bc ab bd -> 3 / 4
    assert distinct_n(texts, 1) == pytest.approx(4 / 6)
    assert distinct_n(texts, 2) == pytest.approx(3 / 4)
    assert distinct_n(["one"], 2) == 0.0 and distinct_n([], 1) == 0.0
    # Within groups: group x holds the two texts above (3/4), group y one text "p q"
    # (1/1); the mean is 7/8. A group without a bigram does not count.
    assert distinct_n_within_groups(texts + ["p q", "z"], ["x", "x", "y", "w"], 2) == (
        pytest.approx((3 / 4 + 1) / 2)
    )
    # Templates: numbers and coordinates masked, whitespace folded.
    same = ["player at 1,2 goal at 3,3", "player  at 0,1 goal at 2,2", "move left"]
    assert template_repetition(same) == pytest.approx(2 / 3)
    assert template_repetition(["a", "b", "c", "d"]) == pytest.approx(1 / 4)
    assert template_repetition(["x 1"] * 5) == 1.0 and template_repetition([]) == 0.0


def stream(iterations, std, kl, grad, entropy=lambda i: 0.9):
    warn = EarlyWarning(warmup=10)
    fired = None
    for i in range(iterations):
        reason = warn.update(std(i), kl(i), grad(i), entropy(i))
        if reason and fired is None:
            fired = (i + 1, reason)
    return warn, fired


def test_the_warning_fires_when_spread_collapses_and_the_step_jumps():
    # Spread 0.4 falling to 0.05 from iteration 60; the KL jumps 10x at 80.
    warn, fired = stream(
        120,
        std=lambda i: 0.4 if i < 60 else 0.05,
        kl=lambda i: 0.005 if i < 80 else 0.5,
        grad=lambda i: 1.0,
    )
    assert fired is not None and 80 < fired[0] <= 90, fired
    assert "in-group reward std" in fired[1] and "step_kl" in fired[1]
    assert warn.fired_at == fired[0]


@pytest.mark.parametrize(
    "std, kl",
    [
        # Learnt the task: the spread falls to 0, the steps stay small. No warning.
        (lambda i: 0.4 if i < 60 else 0.0, lambda i: 0.005),
        # A jump of the step while the spread is healthy. No warning.
        (lambda i: 0.4, lambda i: 0.005 if i < 80 else 0.5),
    ],
)
def test_either_signal_alone_does_not_warn(std, kl):
    _, fired = stream(150, std=std, kl=kl, grad=lambda i: 1.0)
    assert fired is None


def test_an_entropy_running_away_after_the_spread_fell_warns():
    def run(std):  # the entropy climbs from 0.9 to 3 from iteration 60
        rising = lambda i: 0.9 if i < 60 else min(3.0, 0.9 + 0.1 * (i - 60))  # noqa: E731
        return stream(120, std=std, kl=lambda i: 0.005, grad=lambda i: 1.0, entropy=rising)[1]

    # The task learnt (spread 0 from 30), then the entropy runs away.
    fired = run(lambda i: 0.3 if i < 30 else 0.0)
    assert fired is not None and 60 < fired[0] <= 80 and "entropy EMA" in fired[1], fired
    # The same entropy rise while groups still disagree is not the signature.
    assert run(lambda i: 0.3) is None


def test_a_non_finite_gradient_counts_as_a_spike():
    _, fired = stream(
        60,
        std=lambda i: 0.4 if i < 30 else 0.01,
        kl=lambda i: 0.01,
        grad=lambda i: 1.0 if i < 50 else float("nan"),
    )
    assert fired is not None and fired[0] == 51 and "grad_norm is nan" in fired[1]


def test_one_nan_spread_does_not_silence_the_warning():
    """A missing (NaN) in-group std at one iteration leaves the EMA as it was: the
    warning still fires where it fires without it."""

    def run(std):
        return stream(60, std=std, kl=lambda i: 0.01 if i < 40 else 0.5, grad=lambda i: 1.0)[1]

    clean = run(lambda i: 0.4 if i < 30 else 0.01)
    holed = run(lambda i: float("nan") if i == 3 else (0.4 if i < 30 else 0.01))
    assert clean is not None and holed is not None and holed[0] == clean[0], (clean, holed)


def test_non_finite_log_likelihoods_make_every_figure_nan():
    """A NaN must not read as a perfect retrieval nor as a z-score of 0."""
    for bad in (math.nan, -math.inf):
        info = pair_information([[bad, 0.0, 0.0], [0.0, bad, 0.0], [0.0, 0.0, bad]], [1, 1, 1], k=2)
        figures = (info.mutual_information, info.mi_zscore, info.conditional_entropy)
        figures += (info.retrieval_acc_at_1, info.retrieval_acc_at_k)
        assert all(math.isnan(x) for x in figures), info


def test_tied_scores_count_as_chance():
    """Equal scores everywhere: the prompt does not single out its reasoning, and
    retrieval is at chance (k / M), not at 0."""
    info = pair_information(torch.zeros(M, M), torch.ones(M), k=3)
    assert info.retrieval_acc_at_1 == pytest.approx(1 / M)
    assert info.retrieval_acc_at_k == pytest.approx(3 / M)
    # One prompt tied with the own one: rank 1 or 2 with equal odds.
    L = torch.full((3, 3), -5.0)
    L.fill_diagonal_(0.0)
    L[1, 0] = 0.0  # prompt 1 scores reasoning 0 as well as prompt 0 does
    info = pair_information(L, torch.ones(3), k=2)
    assert info.retrieval_acc_at_1 == pytest.approx((0.5 + 1 + 1) / 3)
    assert info.retrieval_acc_at_k == pytest.approx(1.0)


# ----- in the algorithm: the metrics, the warning and the guard -------------------------
GUARD_SCRIPT = """
import json, os, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.maths import collapse
ray.init(num_cpus=2, include_dashboard=False)
# The rule itself is tested on signal streams; here it is made to fire at iteration 3,
# to follow what the algorithm does then.
original = collapse.EarlyWarning.update
def update(self, *signals):
    original(self, *signals)
    if self.iteration == 3:
        self.fired_at = 3
        return "forced for the test"
    return None
collapse.EarlyWarning.update = update
out = {}
for guard in ("off", "checkpoint", "stop"):
    algo = StarPOConfig.from_user_dict(
        {**TINY, "env": "ragen/FrozenLakeNoSlip-v0", "collapse_guard": guard,
         "collapse_metrics_interval": 2}
    ).build_algo()
    rows = []
    for _ in range(5):
        r = algo.train()
        rows.append({"iteration": r["training_iteration"], "done": bool(r.get("done")),
                     **{k: float(v) for k, v in r["collapse"].items()}})
        if r.get("done"):
            break
    out[guard] = {"rows": rows, "files": sorted(os.listdir(algo.logdir))}
    algo.stop()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_the_warning_is_logged_and_the_guard_acts(tmp_path):
    from conftest import TINY, run_script

    out = run_script(GUARD_SCRIPT, tmp_path, define={"TINY": TINY})
    for guard in ("off", "checkpoint", "stop"):
        rows = out[guard]["rows"]
        # The indicators are logged every iteration.
        for row in rows:
            assert 0 <= row["distinct_1"] <= 1 and 0 < row["template_repetition"] <= 1
            emas = {"in_group_reward_std_ema", "step_kl_ema", "grad_norm_ema", "entropy_ema"}
            assert emas <= set(row)
        assert [row["warning"] for row in rows[:3]] == [0, 0, 3]
        # The information metrics every 2nd iteration (1, 3, 5): 2 groups from two
        # FrozenLake states, so M = 2 distinct first-turn prompts, and MI <= log M.
        for row in rows:
            # Computed at iterations 1, 3, 5 (NaN in the results between, like evaluation).
            computed = row["iteration"] % 2 == 1
            assert (row["mi_iteration"] == row["iteration"]) == computed, row
            assert math.isnan(row["mi"]) != computed, row
            if computed:
                assert row["mi_samples"] >= 2 and row["retrieval_chance"] == 1 / row["mi_samples"]
                assert row["mi"] <= math.log(row["mi_samples"]) + 1e-9
                assert row["conditional_entropy"] > 0 and row["mi_s"] > 0
    assert len(out["off"]["rows"]) == 5 and not any(r["done"] for r in out["off"]["rows"])
    assert "checkpoint_collapse_warning_000003" in out["checkpoint"]["files"]
    assert "checkpoint_collapse_warning_000003" not in out["off"]["files"]
    assert len(out["checkpoint"]["rows"]) == 5
    # stop: the trial ends with the warning's iteration.
    assert [r["done"] for r in out["stop"]["rows"]] == [False, False, True]


def test_the_progress_line_says_when_the_warning_fires(capsys):
    from ragen_rllib.cli.train import _print_progress

    progress = _print_progress()
    trial = type("Trial", (), {"trial_id": "t0"})()
    for iteration, warned in ((4, 0), (5, 5), (6, 5)):
        result = {"training_iteration": iteration, "collapse": {"warning": warned}}
        progress.on_trial_result(iteration, [], trial, result)
    lines = capsys.readouterr().out.splitlines()
    assert ["COLLAPSE WARNING" in line for line in lines] == [False, True, False]


def test_pair_loglik_scores_every_reasoning_after_every_prompt():
    """The learner's matrix equals each pair's log-likelihood computed directly."""
    from conftest import tiny_config
    from transformers import AutoModelForCausalLM

    from ragen_rllib.algorithms.starpo.collapse import CollapseWatch, turn_pairs
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    cfg = tiny_config(
        llm="builtin",
        env="ragen/FrozenLakeNoSlip-v0",
        env_groups=3,
        max_turns=3,
        max_new_tokens=24,
        max_tokens_per_microbatch=600,
    )
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    trajs = runner.sample()
    think_end = runner.tokenizer.encode("</think>", add_special_tokens=False)[0]
    reasoning_tokens = CollapseWatch(cfg)._reasoning_tokens  # the run's own cut
    prompts, reasonings = turn_pairs(trajs, 4, reasoning_tokens)
    # One pair per distinct prompt, the first turns first: 3 groups give 3 first
    # prompts (a repeated one would tie with the pair's own and hide it from
    # retrieval), and the fourth pair is a second turn.
    firsts = {tuple(t.segments[t.turn_spans[0][0]].input_ids[: t.turn_spans[0][1]])
              for t in trajs}  # fmt: skip
    assert len(firsts) == 3 and {tuple(p) for p in prompts[:3]} == firsts
    assert len(prompts) == 4 and len({tuple(p) for p in prompts}) == 4
    second = [t for t in trajs if len(t.turn_spans) > 1][0]
    seg, start, _ = second.turn_spans[1]
    assert prompts[3] == second.segments[seg].input_ids[:start]
    assert turn_pairs(trajs, 2, reasoning_tokens)[0] == prompts[:2]
    assert all(z[-1] == think_end for z in reasonings if think_end in z)
    learner = built_learner(cfg, runner.get_spaces())
    matrix = learner.pair_loglik(prompts, reasonings)
    model = AutoModelForCausalLM.from_pretrained(runner._model_path).eval()
    for i, prompt in enumerate(prompts):
        for j, reasoning in enumerate(reasonings):
            ids = torch.tensor([prompt + reasoning])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1 : -1]
            direct = torch.log_softmax(logits.float(), -1).gather(
                -1, torch.tensor(reasoning)[:, None]
            )
            assert matrix[i][j] == pytest.approx(float(direct.sum()), abs=1e-3)
    info = pair_information(torch.tensor(matrix), [len(z) for z in reasonings])
    assert info.mutual_information <= math.log(3) and info.conditional_entropy > 0


def test_two_prompts_give_a_zero_z_score_without_a_warning():
    """Two distinct first prompts (the Bandit's two arm orders): each reasoning has one
    mismatched score, so no spread; the z-score is 0 and torch is not asked for the
    std of one value."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        info = pair_information([[-1.0, -2.0], [-3.0, -0.5]], [2, 2])
    assert info.mi_zscore == 0.0 and info.retrieval_acc_at_1 == 1.0


def test_diversity_metrics_read_the_models_text_not_a_fixed_prefill():
    """With the Sokoban examples' prefill (a closed think block), the metrics measure
    the moves the model wrote: varied answers are not one template."""
    from ragen_rllib.algorithms.starpo.collapse import diversity_metrics
    from ragen_rllib.records.trajectory import Trajectory

    fixed = "<think> go </think> <answer>"
    moves = ["Up || Left", "Down", "Right || Right || Up", "Left || Down"]
    trajs = []
    for group, move in enumerate(moves):
        t = Trajectory(env_id="e", seed=group, group=group, prefill=fixed)
        t.answers = [f"{fixed} {move} </answer>"]
        trajs.append(t)
    out = diversity_metrics(trajs)
    assert out["think_words_mean"] == pytest.approx((3 + 1 + 5 + 3) / 4)  # "Up || Left": 3
    assert out["template_repetition"] == pytest.approx(1 / 4)
    assert out["distinct_2"] > 0.5 and out["distinct_1"] > 0.3


def test_a_checkpoints_warning_state_under_the_old_ema_name_is_restored():
    from ragen_rllib.algorithms.starpo.collapse import CollapseWatch
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    watch = CollapseWatch(StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0"}))
    state = watch.get_state()
    state["ema"] = {"in_group_std": 0.7, "step_kl": 0.01}
    watch.set_state(state)
    assert watch.warning.ema == {"in_group_reward_std": 0.7, "step_kl": 0.01}


def test_a_reasoning_tag_of_several_tokens_ends_the_reasoning_where_it_ends():
    """SmolLM2's tokenizer splits ``</think>`` into several tokens: the pairs' reasoning
    still stops after them (found on the decoded text), and an answer that never closes
    its reasoning stays whole."""
    from ragen_rllib.algorithms.starpo.collapse import CollapseWatch, turn_pairs
    from ragen_rllib.records.trajectory import Segment, Trajectory

    words = ["<", "/", "think", ">", "go", "left", "right", "a", "b"]

    class Split:  # a tokenizer whose tag is four tokens
        def decode(self, ids, skip_special_tokens=True):
            return "".join(words[i] for i in ids)

    def one_turn(prompt, answer):
        t = Trajectory(env_id="x", seed=0, group=0)
        t.segments = [Segment(input_ids=prompt + answer)]
        t.turn_spans = [(0, len(prompt), len(prompt) + len(answer))]
        t.turn_rewards = [0.0]
        return t

    closed = one_turn([7, 8], [4, 5, 0, 1, 2, 3, 6, 6])  # "goleft</think>rightright"
    open_ = one_turn([8, 7], [4, 5, 6])  # never closed
    watch = CollapseWatch.__new__(CollapseWatch)
    watch._tokenizer = Split()
    _, reasonings = turn_pairs([closed, open_], 2, watch._reasoning_tokens)
    assert reasonings == [[4, 5, 0, 1, 2, 3], [4, 5, 6]]
    closed.turn_reasoning_tokens = [3]  # the runner's count wins where it kept one
    assert turn_pairs([closed], 1, watch._reasoning_tokens)[1] == [[4, 5, 0]]
    # A prefill that closed the reasoning itself: the answer holds none of it, so it
    # is kept whole even where it writes the tag again.
    prefilled = one_turn([7, 7], [4, 0, 1, 2, 3, 5])
    prefilled.prefill = "</think>"
    assert turn_pairs([prefilled], 1, watch._reasoning_tokens)[1] == [[4, 0, 1, 2, 3, 5]]
