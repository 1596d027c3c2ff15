"""Remote rollout actors: all sampling on the remote runners, the P groups split between
them, asynchronous sampling under a policy-lag bound, checkpointed seed stream, and a
runner killed mid-run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_script, tiny_dict

pytestmark = pytest.mark.slow

# Each script starts with this; BASE (the config dict) is bound by _run.
PRELUDE = """
import json, os, signal, time, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=3, include_dashboard=False)
def make(**over):
    return StarPOConfig.from_user_dict({**BASE, **over}).build_algo()
def runners(algo, fn):
    return algo.env_runner_group.foreach_env_runner(fn, local_env_runner=False)
"""


def _run(script: str, tmp: Path):
    base = tiny_dict(env_groups=3, minibatch_size=2, seed=5)
    return run_script(PRELUDE + script, tmp, timeout=900, define={"BASE": base})


def test_remote_runners_split_the_groups_and_the_seed_stream_is_checkpointed(tmp_path):
    out = _run(
        """
algo = make(num_env_runners=2)
rows = [algo.env_runner is None]
for _ in range(2):
    rows.append(algo.train()["rollout"]["num_trajectories"])
rows.append(sorted(runners(algo, lambda r: (r.worker_index, r.num_groups_sampled))))
path = algo.save_to_path(os.path.abspath("ckpt"))
after = algo.train()["rollout"]
algo.stop()
restored = make(num_env_runners=2)
restored.restore_from_path(path)
again = restored.train()["rollout"]
keys = ("reward_mean", "trajectory_tokens_mean", "response_length_mean")
rows.append([[after[k], again[k]] for k in keys])
print(json.dumps(rows))
""",
        tmp_path,
    )
    no_local, n1, n2, sampled, pairs = out
    assert no_local  # no runner in the driver: the remote runners do all the sampling
    assert n1 == n2 == 6  # P=3 groups x N=2 in total, not per runner
    assert sampled == [[1, 4], [2, 2]]  # 2 + 1 groups per iteration
    # The restored run draws the same states and samples the same trajectories.
    assert all(a == b for a, b in pairs), pairs


def test_async_sampling_keeps_the_policy_lag_within_its_bound(tmp_path):
    out = _run(
        """
rows = []
for online_k, bound in ((1, 1), (2, 2)):
    algo = make(num_env_runners=1, async_rollouts=True, online_k=online_k, max_policy_lag=bound)
    lags = []
    for _ in range(6):
        r = algo.train()["rollout"]
        lags.append([r["policy_lag_max"], r["policy_lag_mean"], r["batch_uses"]])
    rows.append([bound, lags, algo._buffer.num_dropped_stale])
    algo.stop()
print(json.dumps(rows))
""",
        tmp_path,
    )
    for bound, lags, dropped in out:
        assert all(lag <= bound for lag, _, _ in lags), (bound, lags)
        # Asynchronous: after the first batch, every batch was sampled during the
        # previous update, so it is at least one version old.
        assert all(mean >= 1 for _, mean, _ in lags[1:]), lags
        assert dropped == 0
    assert [uses for _, _, uses in out[1][1]][:4] == [1, 2, 1, 2]


def test_a_runner_killed_mid_run_is_restarted_and_its_share_resampled(tmp_path):
    out = _run(
        """
algo = make(num_env_runners=2, async_rollouts=True)
rows = [algo.train()["rollout"]["num_trajectories"] for _ in range(2)]
pids = dict(runners(algo, lambda r: (r.worker_index, os.getpid())))
os.kill(pids[2], signal.SIGKILL)  # runner 2 dies holding its share of the next batch
for _ in range(3):
    result = algo.train()
    rows.append(result["rollout"]["num_trajectories"])
failures = result["counters"]["num_runner_failures_lifetime"]
# Ray restarts the actor (model load included); each iteration probes for it.
deadline = time.time() + 120
while algo.env_runner_group.num_healthy_remote_env_runners() < 2 and time.time() < deadline:
    algo.train()
    time.sleep(0.5)
versions = sorted(runners(algo, lambda r: (r.worker_index, r.engine.policy_version, os.getpid())))
rows.append([failures, versions, pids[2], algo._policy_version])
print(json.dumps(rows))
""",
        tmp_path,
    )
    *counts, (failures, versions, dead_pid, version) = out
    assert counts == [6] * 5  # every batch whole: the lost share was sampled again
    assert failures >= 1
    assert len(versions) == 2, versions  # the dead runner is back
    (_, v1, _), (_, v2, pid2) = versions
    assert pid2 != dead_pid and v1 == v2 == version  # restarted, with the current weights
