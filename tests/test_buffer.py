"""The rollout buffer shared by online-k reuse and asynchronous sampling."""

import pytest

from ragen_rllib.algorithms.starpo.buffer import FreshnessBuffer
from ragen_rllib.records.trajectory import Trajectory


def batch(version: int, n: int = 2) -> list[Trajectory]:
    return [Trajectory(env_id="e", seed=i, group=0, policy_version=version) for i in range(n)]


def test_a_batch_is_handed_out_online_k_times_then_dropped():
    buf = FreshnessBuffer(online_k=2, max_policy_lag=1)
    assert buf.sample(policy_version=0) is None and not buf.has_fresh(0)
    buf.add(batch(0))
    first = buf.sample(policy_version=0)
    assert [t.uses for t in first] == [1, 1] and [t.policy_lag for t in first] == [0, 0]
    state = buf.get_state()
    second = buf.sample(policy_version=1)  # one update later
    assert [t.uses for t in second] == [2, 2] and [t.policy_lag for t in second] == [1, 1]
    assert len(buf) == 0 and buf.sample(policy_version=1) is None
    # The state holds the batch with one use left.
    restored = FreshnessBuffer(online_k=2, max_policy_lag=1)
    restored.set_state(state)
    assert len(restored) == 1 and [t.uses for t in restored.sample(policy_version=1)] == [2, 2]
    assert len(restored) == 0


def test_trajectories_older_than_the_lag_bound_are_dropped_and_counted():
    buf = FreshnessBuffer(online_k=1, max_policy_lag=1)
    mixed = batch(3) + batch(5)
    buf.add(mixed)
    buf.add(batch(6))
    assert buf.has_fresh(6)
    out = buf.sample(policy_version=6)  # lags 3 (dropped) and 1 (kept)
    assert [t.policy_version for t in out] == [5, 5]
    assert max(t.policy_lag for t in out) <= 1 and buf.num_dropped_stale == 2
    # A batch with nothing fresh left is skipped entirely, counted, never returned.
    buf.add(batch(2))
    out = buf.sample(policy_version=7)  # the version-6 batch (lag 1) first
    assert [t.policy_version for t in out] == [6, 6]
    assert buf.sample(policy_version=7) is None and buf.num_dropped_stale == 4


def test_a_callers_edits_never_reach_the_stored_batch():
    buf = FreshnessBuffer(online_k=2, max_policy_lag=2)
    buf.add(batch(0, n=3))
    taken = buf.sample(policy_version=0)
    taken.clear()
    assert len(buf.sample(policy_version=0)) == 3


def test_bad_bounds_are_rejected():
    with pytest.raises(ValueError, match="online_k"):
        FreshnessBuffer(online_k=0)
    with pytest.raises(ValueError, match="max_policy_lag"):
        FreshnessBuffer(online_k=1, max_policy_lag=-1)


def test_weights_travel_as_arrays_and_come_back_bit_exact():
    import torch

    from ragen_rllib.distributed.wire import from_wire, is_wire, to_wire

    state = {"a": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16)}
    wire = to_wire(state)
    assert is_wire(wire) and not is_wire(state)
    back = from_wire(wire)
    assert back["a"].dtype == torch.float32 and torch.equal(back["a"], state["a"])
    assert back["b"].dtype == torch.bfloat16 and torch.equal(back["b"], state["b"])
