"""The learner's update: response-only log-probabilities, micro-batches that give
the same step as one pass, and the shards and minibatches of several learners."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import built_learner, first_adamw_step_bound, frozenlake_gae_config, learner_batch

from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.learner.connectors import build_learner_pipeline
from ragen_rllib.learner.starpo_learner import _zero_weighted
from ragen_rllib.maths.batching import (
    fill_plan,
    microbatch_rows,
    minibatch_plan,
    num_minibatches,
    shard_trajectories,
    take_rows,
)
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule
from ragen_rllib.rl_module.logprobs import token_logprobs_and_entropy

config = frozenlake_gae_config


@pytest.fixture(scope="module")
def trajectories():
    runner = LLMEnvRunner(config=config(), worker_index=0)
    trajs = runner.sample()
    assert len({t.num_turns for t in trajs}) > 1  # rows of different lengths
    return runner, trajs


# ----- pure pieces -------------------------------------------------------------------
def test_microbatch_rows_respect_the_budget_and_cover_every_row():
    lengths = [50, 10, 30, 30, 70, 20]
    assert microbatch_rows(lengths, None) == [[0, 1, 2, 3, 4, 5]]
    plan = microbatch_rows(lengths, 100)
    assert sorted(i for mb in plan for i in mb) == list(range(6))
    for mb in plan:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 100
    assert plan[0] == [4]  # 70 + a second row of 50 would pad to 140
    assert microbatch_rows(lengths, 1) == [[4], [0], [2], [3], [5], [1]]


def test_fill_plan_reaches_the_agreed_count_of_micro_batches():
    """Sharded learners must run equally many passes: a shorter plan is stretched by
    halving its largest micro-batches, then by blank passes."""
    plan = [[4], [0, 2, 3, 5], [1]]
    out = fill_plan(plan, 5)
    assert len(out) == 5
    assert sorted(i for mb in out for i in mb) == list(range(6))  # every row once
    assert out == [[4], [0], [2], [3, 5], [1]]
    out = fill_plan([[0, 1], [2]], 5)
    assert out == [[0], [1], [2], [], []]
    assert fill_plan(plan, 2) == plan  # never shortened


def test_take_rows_cuts_the_padding_of_its_rows():
    batch = {
        "input_ids": torch.arange(12).reshape(3, 4),
        "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]]),
        "row_trajectory": torch.tensor([7, 8, 9]),
    }
    part = take_rows(batch, [2, 1])
    assert part["input_ids"].tolist() == [[8, 9], [4, 5]]
    assert part["row_trajectory"].tolist() == [9, 8]
    # The empty row list of a padded plan entry is an empty batch, not an error.
    empty = take_rows(batch, [])
    assert empty["input_ids"].shape == (0, 0) and empty["row_trajectory"].shape == (0,)


def test_a_zero_weighted_pass_reaches_every_output_and_adds_nothing():
    """The pass a learner adds to keep step with the others: a backward pass through
    every output of RLlib's nested {module: {name: tensor}} forward, worth 0."""
    w = torch.nn.Parameter(torch.ones(3))
    v = torch.nn.Parameter(torch.ones(2))
    out = {"default_policy": {"logp": w * 2, "values": v * 3, "count": 4}}
    _zero_weighted(out).backward()
    assert w.grad is not None and v.grad is not None
    assert not w.grad.any() and not v.grad.any()
    with pytest.raises(RuntimeError, match="no output that needs a gradient"):
        _zero_weighted({"default_policy": {"logp": torch.ones(2)}})


def test_shards_are_whole_trajectories_balanced_by_tokens():
    tokens = [100, 900, 300, 300, 500, 100, 400, 200]
    shards = shard_trajectories(tokens, 2)
    assert sorted(i for s in shards for i in s) == list(range(8))
    assert [len(s) for s in shards] == [4, 4]
    loads = [sum(tokens[i] for i in s) for s in shards]
    assert abs(loads[0] - loads[1]) <= 200
    assert shard_trajectories(tokens, 1) == [list(range(8))]


def test_minibatch_plan_counts_trajectories_and_steps_every_learner_together():
    # One learner, 10 trajectories, minibatches of 4: 3 steps of 4, 3, 3.
    assert num_minibatches([10], 4) == 3
    plan = minibatch_plan(10, 3, num_epochs=2, shuffle=True, seed=3)
    assert plan.shape == (10, 2)
    for e in range(2):
        sizes = np.bincount(plan[:, e])
        assert sorted(sizes.tolist()) == [3, 3, 4]
    assert not np.array_equal(plan[:, 0], plan[:, 1])
    # Two learners with 4 trajectories each, minibatches of 4: 2 steps, and each
    # learner puts two of its trajectories in each (the same count on both).
    assert num_minibatches([4, 4], 4) == 2
    for shard in (4, 4):
        part = minibatch_plan(shard, 2, num_epochs=1, shuffle=False, seed=0)
        assert np.bincount(part[:, 0]).tolist() == [2, 2]
    # The smallest shard caps the count: every minibatch takes from every learner.
    assert num_minibatches([1, 7], 2) == 1
    assert num_minibatches([0], 4) == 1


# ----- the module: the LM head on response positions only ----------------------------
def test_response_logprobs_equal_the_full_logits_path(trajectories):
    runner, trajs = trajectories
    cfg = runner.config
    module = LLMRLModule(
        observation_space=None, action_space=None, model_config=cfg.llm_module_config()
    )
    batch = learner_batch(cfg, module, trajs)
    with torch.no_grad():
        out = module.forward_train(batch)
        logits = module.actor(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).logits
        logp, entropy = token_logprobs_and_entropy(logits[:, :-1], batch["input_ids"][:, 1:])
    mask = batch["response_mask"][:, 1:] > 0
    assert (out["logp"][:, 1:] - logp)[mask].abs().max() <= 1e-5
    assert (out["entropy"][:, 1:] - entropy)[mask].abs().max() <= 1e-4
    assert not out["logp"][:, 1:][~mask].any()  # nothing computed elsewhere


# ----- the learner: micro-batches give the same step --------------------------------
def _one_update(trajs, spaces, **overrides):
    cfg = config(**overrides)
    learner = built_learner(cfg, spaces)
    learner.update(episodes=trajs, minibatch_size=len(trajs), num_epochs=1)
    module = learner.module["default_policy"]
    params = {k: v.detach().clone() for k, v in module.named_parameters()}
    grads = {k: v.grad.detach().clone() for k, v in module.named_parameters() if v.grad is not None}
    return params, grads


def _independent_gradients(trajs, spaces, **overrides):
    """The gradient of StarPO's loss on the whole batch, written out here from its
    definition (token-mean clipped surrogate with dual clip, entropy bonus, clipped
    value loss) on a fresh module with the learner's initial weights."""
    cfg = config(**overrides)
    learner = built_learner(cfg, spaces)
    module = learner.module["default_policy"]
    batch = learner_batch(cfg, module, trajs)
    out = module.forward_train(batch)
    mask = batch["response_mask"] > 0
    n = mask.sum()
    ratio = torch.exp(out["logp"] - batch["behaviour_logp"])[mask]
    adv = batch["advantages"][mask]
    surrogate = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high))
    surrogate = torch.where(adv < 0, torch.minimum(surrogate, -adv * cfg.dual_clip), surrogate)
    total = surrogate.sum() / n - cfg.entropy_coeff * out["entropy"][mask].sum() / n
    if "values" in out:
        v, v_old = out["values"][mask], batch["old_values"][mask]
        target = batch["value_targets"][mask]
        v_clipped = v_old + (v - v_old).clamp(-cfg.vf_clip, cfg.vf_clip)
        vf = 0.5 * torch.maximum((v - target) ** 2, (v_clipped - target) ** 2).sum() / n
        total = total + cfg.vf_loss_coeff * vf
    module.zero_grad()
    total.backward()
    return {k: p.grad.detach().clone() for k, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_one_update_in_1_2_or_4_microbatches_gives_the_same_parameters(trajectories, estimator):
    runner, trajs = trajectories
    spaces = runner.get_spaces()
    lengths = sorted((t.num_tokens for t in trajs), reverse=True)
    # Budgets that cut the 8 rows into 2 and into 4 micro-batches.
    two, four = 4 * lengths[0], 2 * lengths[0]
    assert len(microbatch_rows(lengths, two)) == 2 and len(microbatch_rows(lengths, four)) == 4
    # Whitening happens before the micro-batch split, so it is left out here: the
    # whitened advantages put some weights' gradients near AdamW's eps, where the first
    # step (about lr * g / (|g| + eps)) turns fp32 summation-order noise into ~1% of a
    # step; the gradients themselves still agree to 1e-4 relative with whitening on.
    # No gradient clipping, so that the gradients can be compared with the independent
    # formula below as they come out of the loss.
    common = {"advantage_estimator": estimator, "whiten_advantages": False, "grad_clip": None}
    ref_params, ref_grads = _one_update(trajs, spaces, **common)
    assert sum(g.abs().sum().item() for g in ref_grads.values()) > 0  # a real step
    # The one-pass gradient itself equals that of the loss written out independently,
    # so an error common to every budget (a coefficient, a sign, a factor) is caught.
    expected = _independent_gradients(trajs, spaces, **common)
    assert expected.keys() == ref_grads.keys()
    for k, g in expected.items():
        scale = g.abs().max().item() + 1e-12
        assert (ref_grads[k] - g).abs().max().item() <= 1e-4 * scale, k
    for budget in (two, four):
        params, grads = _one_update(trajs, spaces, max_tokens_per_microbatch=budget, **common)
        assert grads.keys() == ref_grads.keys()
        for k, g in grads.items():
            scale = ref_grads[k].abs().max().item() + 1e-12
            assert (g - ref_grads[k]).abs().max().item() <= 1e-4 * scale, k
        for k, p in params.items():  # each entry within what its gradient difference allows
            p_ref = ref_params[k].numpy()
            bound = first_adamw_step_bound(grads[k].numpy(), ref_grads[k].numpy(), p_ref)
            assert (np.abs(p.numpy() - p_ref) <= bound).all(), k


@pytest.mark.parametrize("window", [None, 0, 1, 2])
@pytest.mark.parametrize("chunk", [128, 5])
def test_shared_prefixes_give_the_plain_paths_logprobs_values_and_gradients(
    window, chunk, monkeypatch
):
    """Each prefix the rows share encoded once (the prefix tree): the same
    log-probabilities, entropies and critic values (<= 1e-5) and the same gradients
    as encoding every row in full, on multi-turn FrozenLake batches in every context
    mode (the whole history, and windows of 0, 1 and 2 turns), with the attention's
    query chunks as long as a row and a few tokens short."""
    from ragen_rllib.maths import batching
    from ragen_rllib.rl_module.packing import Packed
    from ragen_rllib.rl_module.scoring import response_logprobs

    monkeypatch.setattr(batching, "QUERY_CHUNK", chunk)
    cfg = config(context_window=window, max_turns=4, group_size=4, seed=3)
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    trajs = runner.sample()
    module = LLMRLModule(
        observation_space=None, action_space=None, model_config=cfg.llm_module_config()
    )
    assert module.shares_prefixes
    batch = learner_batch(cfg, module, trajs)
    batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    packed = Packed.from_rows(batch["input_ids"], batch["attention_mask"], True)
    total = int(batch["attention_mask"].sum())
    assert packed.shared is not None and packed.encoded < 0.8 * total  # the tree is used
    if chunk == 5:  # the rows' own tokens in several chunks each
        assert packed.shared.query_index.shape[0] > 2 * batch["input_ids"].shape[0]
    if window is not None:  # one row a turn: rows of one trajectory share its start
        assert batch["input_ids"].shape[0] > len(trajs)
    mask = batch["response_mask"]
    outs, grads = [], []
    for share in (True, False):
        module.zero_grad()
        module.shares_prefixes = share
        out = response_logprobs(module.actor, batch, 1.0, share_prefixes=share)
        values = module.compute_values(batch)
        loss = (out["logp"] * mask).sum() + (out["entropy"] * mask).sum()
        (loss + (values * mask).sum()).backward()
        outs.append({**out, "values": values})
        params = module.named_parameters()
        grads.append({k: p.grad.clone() for k, p in params if p.grad is not None})
    real = mask > 0
    for key in ("logp", "entropy", "values"):
        assert (outs[0][key] - outs[1][key])[real].abs().max() <= 1e-5, key
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for k, g in grads[0].items():
        assert (g - grads[1][k]).abs().max() <= 1e-4 * (grads[1][k].abs().max() + 1e-12), k


def test_packed_rows_give_the_padded_paths_logprobs_values_and_gradients(trajectories):
    """A micro-batch packed into one sequence (positions restarting per row, attention
    within each row) gives the padded batch's log-probabilities, entropies and
    critic values (<= 1e-5) and the same gradients."""
    from ragen_rllib.rl_module.scoring import packs, response_logprobs

    runner, trajs = trajectories
    cfg = runner.config.copy(copy_frozen=False)
    cfg.advantage_estimator = "gae"  # a critic too
    modules = {}
    for pack in (True, False):
        model_config = {**cfg.llm_module_config(), "pack_sequences": pack}
        modules[pack] = LLMRLModule(
            observation_space=None, action_space=None, model_config=model_config
        )
    modules[True].load_state_dict(modules[False].state_dict())  # the value head's init too
    assert packs(modules[True].actor) and packs(modules[True].critic)
    assert not packs(modules[False].actor)
    batch = build_learner_pipeline(cfg)(
        rl_module={"default_policy": modules[False]}, batch={}, episodes=trajs
    )["default_policy"]
    batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    lengths = batch["attention_mask"].sum(1)
    assert len(set(lengths.tolist())) > 2  # rows of different lengths: padding to remove
    mask = batch["response_mask"]
    outs, grads = {}, {}
    for pack, module in modules.items():
        out = response_logprobs(module.actor, batch, 1.0, share_prefixes=False)
        values = module.compute_values(batch)
        loss = (out["logp"] * mask).sum() + (out["entropy"] * mask).sum()
        (loss + (values * mask).sum()).backward()
        outs[pack] = {**out, "values": values}
        grads[pack] = {k: p.grad for k, p in module.named_parameters() if p.grad is not None}
    real = mask > 0
    for key in ("logp", "entropy", "values"):
        assert (outs[True][key] - outs[False][key])[real].abs().max() <= 1e-5, key
    assert grads[True].keys() == grads[False].keys() and len(grads[True]) > 10
    for k, g in grads[True].items():
        ref = grads[False][k]
        assert (g - ref).abs().max() <= 1e-4 * (ref.abs().max() + 1e-12), k


def test_an_update_takes_one_optimizer_step_per_minibatch_and_epoch(trajectories):
    """RLlib hands the whole batch to ``_update`` once; the learner takes
    ``num_epochs`` x ``minibatches_per_epoch`` optimizer steps on whole trajectories,
    each trajectory once per epoch, and counts each row once per epoch trained."""
    runner, trajs = trajectories
    learner = built_learner(config(), runner.get_spaces())
    steps = []
    step = learner.optimizer_step

    def counted(batch, first=False):
        rows = batch["default_policy"]["row_trajectory"].tolist()
        steps.append((first, sorted(set(rows))))
        return step(batch, first=first)

    learner.optimizer_step = counted
    out = learner.update(episodes=trajs, minibatch_size=3, num_epochs=2, minibatches_per_epoch=3)
    assert [first for first, _ in steps] == [True] + [False] * 5
    per_epoch = [sorted(t for _, ts in steps[e * 3 : e * 3 + 3] for t in ts) for e in (0, 1)]
    batch = learner_batch(config(), learner.module["default_policy"], trajs)
    owners = sorted(set(batch["row_trajectory"].tolist()))
    assert per_epoch == [owners, owners]  # every trajectory once in each epoch
    trained = out["default_policy"]["num_module_steps_trained"].peek()
    assert int(trained) == 2 * len(batch["input_ids"])
