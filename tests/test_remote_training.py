"""A training run whose env server dies mid-run: the failed trajectories are counted
as env errors, their groups leave the update, and the run goes on, or stops with a
clear error when the failures pass ``max_env_error_share``."""

from __future__ import annotations

import pytest
from conftest import run_script, tiny_dict

pytest.importorskip("openenv")  # the `openenv` extra
pytestmark = pytest.mark.slow

from test_remote_env import serve  # noqa: E402


def test_a_server_killed_mid_run_costs_counted_env_errors_within_the_budget(tmp_path):
    server = serve(tmp_path, "ragen/Bandit-v0", "--env-config", "{}")
    # One remote Bandit group and three local FrozenLake groups of 2 rollouts each.
    mix = [
        {"env": server.url, "groups": 1, "name": "remote", "env_config": {"timeout_s": 5}},
        {"env": "ragen/FrozenLakeNoSlip-v0", "groups": 3, "max_turns": 2},
    ]
    base = {k: v for k, v in tiny_dict().items() if k not in ("env", "env_groups")}
    configs = {
        share: {**base, "env_mix": mix, "max_env_error_share": share, "minibatch_size": 4}
        for share in (0.5, 0.1)
    }
    script = """
import json, os, signal, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.connectors.sample_batch import EnvErrorBudgetExceeded
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
algos = {share: StarPOConfig.from_user_dict(c).build_algo() for share, c in CONFIGS.items()}

def row(r):
    return {"errors": r["rollout"]["env_errors"],
            "remote": r["rollout"].get("remote", {}).get("num_trajectories", 0),
            "dropped": r["rollout"]["env_error_groups_dropped"],
            "lifetime": r["counters"]["num_env_errors_lifetime"],
            "trained": r["learners"]["default_policy"]["num_module_steps_trained"]}

out = {share: [row(a.train())] for share, a in algos.items()}
os.kill(PID, signal.SIGKILL)  # the server dies between iterations
for share, algo in algos.items():
    for _ in range(2):
        try:
            out[share].append(row(algo.train()))
        except EnvErrorBudgetExceeded as err:
            out[share].append({"stopped": str(err)})
            break
print(json.dumps({str(k): v for k, v in out.items()}, default=int))
"""
    define = {"CONFIGS": configs, "PID": server.proc.pid}
    out = run_script(script, tmp_path, timeout=600, define=define)
    went_on, stopped = out["0.5"], out["0.1"]
    # Before the kill: 8 trajectories, none failed, all trained.
    assert went_on[0] == {"errors": 0, "remote": 2, "dropped": 0, "lifetime": 0, "trained": 8}
    # After: the remote group's 2 trajectories fail each iteration (2 of 8 = 25%, inside
    # a budget of 50%): counted, their group dropped, the 6 local ones trained.
    for i, r in enumerate(went_on[1:], start=1):
        assert r == {"errors": 2, "remote": 0, "dropped": 1, "lifetime": 2 * i, "trained": 6}
    # With a budget of 10% the same failure stops the run, naming the env and the cause.
    assert stopped[0]["errors"] == 0 and len(stopped) == 2
    assert "max_env_error_share=0.1" in stopped[1]["stopped"]
    assert "openenv+http://127.0.0.1" in stopped[1]["stopped"]
