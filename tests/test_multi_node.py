"""Multi-node on one machine: a three-node local Ray cluster (``ray.cluster_utils.Cluster``),
the learner on the head node, the rollout actors pinned to the two worker nodes by a
custom resource, weights crossing nodes through the object store, one runner node
killed hard (training goes on, the runner comes back on the other node, batches stay
whole, the loss is counted), then the last one (training stops with an error naming
the resources, in bounded time, and the checkpoint saved before the loss loads)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import pytest
from conftest import private_env, run_script, tiny_dict

from ragen_rllib.algorithms.starpo.sampling import RunnerFailure, SamplingMixin
from ragen_rllib.distributed import cluster

SCRIPT = r"""
import hashlib, json, os, time, ray
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from ragen_rllib.algorithms.starpo.starpo import StarPO, StarPOConfig
from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

start = time.time()
out = {"phases": {}}
def phase(name):
    out["phases"][name] = round(time.time() - start, 1)

def fingerprint(state):
    # sha256 over the tensors' bytes, in name order: equal only for identical weights.
    h = hashlib.sha256()
    for name in sorted(state):
        h.update(name.encode())
        h.update(state[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()

def learner_fingerprint(algo):
    state = algo.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
        inference_only=True,
    )[COMPONENT_LEARNER][COMPONENT_RL_MODULE]
    return fingerprint(state.get(DEFAULT_MODULE_ID, state))

def runners(algo):
    # Asked of each runner in its own process; queued behind its weight pushes.
    def ask(r):
        weights = r.engine.model.state_dict()
        return {
            "index": r.worker_index,
            "node": ray.get_runtime_context().get_node_id(),
            "pid": os.getpid(),
            "version": r.engine.policy_version,
            "weights": fingerprint({k: weights[k] for k in NAMES}),
        }
    rows = algo.env_runner_group.foreach_env_runner(ask, local_env_runner=False)
    return sorted(rows, key=lambda row: row["index"])

def train(algo, n):
    rows = []
    for _ in range(n):
        r = algo.train()
        rows.append({"trajectories": r["rollout"]["num_trajectories"],
                     "version": r["rollout"]["policy_version"],
                     "counters": r["counters"]})
    return rows

# Short health checks, so that the head learns of a dead node in seconds. A spread
# threshold of 0: an actor goes to the least-used node that can hold it (by default a
# node below half use is as good as an empty one, so both runners could land on the big
# node, depending on which the scheduler drew first).
system = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 1000,
          "health_check_timeout_ms": 3000, "health_check_failure_threshold": 3,
          "scheduler_spread_threshold": 0.0}
common = {"object_store_memory": 100 * 1024**2, "temp_dir": TEMP}
cluster = Cluster(initialize_head=True, head_node_args={
    **common, "num_cpus": 1, "resources": {"learner": 1}, "include_dashboard": False,
    "_system_config": system})
# One runner fits on the small node, two on the big one, so the big node can take the
# small one's runner when the small one dies. Until then a placeholder holds one of
# the big node's two runner seats: the two runners, asked for at once, cannot both
# land there (the scheduler may decide both before it counts the first; seen once).
small = cluster.add_node(**common, num_cpus=1, resources={"rollout": 1})
big = cluster.add_node(**common, num_cpus=2, resources={"rollout": 2})
cluster.wait_for_nodes()
ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
head_id, small_id, big_id = cluster.head_node.node_id, small.node_id, big.node_id

@ray.remote(num_cpus=1, resources={"rollout": 1})
class Seat:
    def ready(self):
        return True

seat = Seat.options(
    scheduling_strategy=NodeAffinitySchedulingStrategy(big_id, soft=False)).remote()
ray.get(seat.ready.remote())
out["nodes"] = {"head": head_id, "small": small_id, "big": big_id}
out["driver_node"] = ray.get_runtime_context().get_node_id()
out["rollout_resource"] = {
    n["NodeID"]: n["Resources"].get("rollout", 0) for n in ray.nodes() if n["Alive"]}
phase("cluster")
try:
    algo = StarPOConfig.from_user_dict(BASE).build_algo()
    NAMES = sorted(algo.learner_group.get_state(
        components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
        inference_only=True)[COMPONENT_LEARNER][COMPONENT_RL_MODULE].get(DEFAULT_MODULE_ID))
    out["learner_local"] = algo.learner_group.is_local and algo.env_runner is None
    out["initial"] = runners(algo)
    phase("build")

    out["before"] = train(algo, 3)
    out["synced"] = runners(algo)
    out["learner"] = {"version": algo._policy_version, "weights": learner_fingerprint(algo)}
    phase("train before the loss")

    # The big node's second seat is free again, for the small node's runner.
    ray.kill(seat)
    while ray.available_resources().get("rollout", 0) < 1 and time.time() < start + 600:
        time.sleep(0.1)
    # Kill the small node: its raylet and workers, SIGKILL, no goodbye.
    cluster.remove_node(small, allow_graceful=False)
    kill = time.time()
    out["after"] = train(algo, 3)
    # Ray restarts the lost runner on the big node; each iteration probes for it.
    while algo.env_runner_group.num_healthy_remote_env_runners() < 2 and time.time() < kill + 120:
        out["after"] += train(algo, 1)
    out["recovered_s"] = round(time.time() - kill, 1)
    out["after"] += train(algo, 1)  # a sample and an update with both runners back
    out["restarted"] = runners(algo)
    out["learner_after"] = {"version": algo._policy_version, "weights": learner_fingerprint(algo)}
    checkpoint = algo.save_to_path(os.path.abspath("checkpoint"))
    out["saved"] = {"version": algo._policy_version, "counters": dict(algo._lifetime)}
    phase("train after the first loss")

    # Kill the last runner node: nothing can hold a runner any more.
    cluster.remove_node(big, allow_graceful=False)
    kill = time.time()
    try:
        out["last"] = train(algo, 5)
    except Exception as err:
        out["failure"] = {"type": type(err).__name__, "message": str(err),
                          "seconds": round(time.time() - kill, 1)}
    algo.stop()
    phase("fail after the last loss")

    # The checkpoint is on the head's disk and loads. As saved, it asks for runners no
    # node can hold: refused at once, naming the resources. With the runner in the
    # driver (num_env_runners 0) it restores and trains on.
    out["checkpoint_files"] = sorted(os.listdir(checkpoint))
    try:
        StarPO.from_checkpoint(checkpoint)
    except Exception as err:
        out["from_checkpoint"] = {"type": type(err).__name__, "message": str(err)}
    restored = StarPOConfig.from_user_dict(
        {**BASE, "num_env_runners": 0, "async_rollouts": False,
         "custom_resources_per_env_runner": {}}).build_algo()
    restored.restore_from_path(checkpoint)
    out["restored"] = {"version": restored._policy_version,
                       "weights": learner_fingerprint(restored),
                       "counters": dict(restored._lifetime),
                       "next": train(restored, 1)}
    restored.stop()
    phase("restore")
finally:
    ray.shutdown()
    cluster.shutdown()
print(json.dumps(out))
"""


@pytest.mark.slow
def test_runner_nodes_lost_one_then_all(tmp_path):
    start = time.monotonic()
    base = tiny_dict(
        env_groups=4,
        minibatch_size=4,
        seed=7,
        num_env_runners=2,
        async_rollouts=True,
        num_cpus_per_env_runner=1,
        custom_resources_per_env_runner={"rollout": 1},
        env_runner_health_probe_timeout_s=60,
    )
    # Ray's session folder holds socket paths of at most 107 bytes: a short folder.
    temp = tempfile.mkdtemp(prefix="ragen-mn-")
    try:
        out = run_script(SCRIPT, tmp_path, timeout=600, define={"BASE": base, "TEMP": temp})
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    elapsed = time.monotonic() - start
    print(f"\nmulti-node test: {elapsed:.1f} s; phases (s since the script began): {out['phases']}")
    print(
        f"iterations: {len(out['before'])} before the first node loss, {len(out['after'])} "
        f"after it (runner back after {out['recovered_s']} s); trajectories per batch "
        f"{[row['trajectories'] for row in out['before'] + out['after']]}"
    )
    print(f"counters after the first loss: {out['after'][-1]['counters']}")
    print(f"after the last loss: {out.get('failure')}")

    nodes = out["nodes"]
    head, small, big = nodes["head"], nodes["small"], nodes["big"]
    whole = 4 * 2  # P groups x N rollouts

    # Placement: the driver, and with it the learner, on the head; the runner resource
    # on the worker nodes only; one runner on each worker node.
    assert out["driver_node"] == head
    assert out["learner_local"]
    assert out["rollout_resource"] == {head: 0, small: 1, big: 2}
    assert {r["node"] for r in out["initial"]} == {small, big}, out["initial"]
    assert all(r["version"] == 0 for r in out["initial"])

    # Weights cross nodes: both runners hold the learner's newest version, bit for bit.
    assert [row["trajectories"] for row in out["before"]] == [whole] * 3
    learner = out["learner"]
    assert learner["version"] == 3
    assert learner["weights"] != out["initial"][0]["weights"]  # the updates changed them
    for runner in out["synced"]:
        assert runner["version"] == learner["version"], out["synced"]
        assert runner["weights"] == learner["weights"], out["synced"]
    lost = next(r for r in out["initial"] if r["node"] == small)

    # One runner node lost: every batch whole, the lost runner back on the big node with
    # the newest weights, and the loss counted.
    assert [row["trajectories"] for row in out["after"]] == [whole] * len(out["after"])
    assert out["after"][-1]["version"] > learner["version"]
    restarted = {r["index"]: r for r in out["restarted"]}
    assert len(restarted) == 2
    assert {r["node"] for r in restarted.values()} == {big}
    assert restarted[lost["index"]]["pid"] != lost["pid"]
    for runner in restarted.values():
        assert runner["version"] == out["learner_after"]["version"]
        assert runner["weights"] == out["learner_after"]["weights"]
    counters = out["after"][-1]["counters"]
    assert counters["num_runner_failures_lifetime"] >= 1
    assert counters["num_resampled_groups_lifetime"] >= 2  # the lost share: 2 of 4 groups
    assert counters["num_resampled_groups_lifetime"] % 2 == 0
    assert counters["num_runner_restarts_lifetime"] >= 1

    # The last runner node lost: a clear error, soon, not a wait for resources.
    failure = out.get("failure")
    assert failure is not None, "training went on with no runner node left"
    assert failure["type"] == "RunnerFailure"
    message = failure["message"]
    assert "no alive node" in message and "'rollout': 1.0" in message, message
    assert "custom_resources_per_env_runner" in message, message
    assert failure["seconds"] < 60, failure

    # The checkpoint saved before the loss is there and loads.
    assert out["checkpoint_files"], out
    refused = out["from_checkpoint"]
    assert refused["type"] == "ValueError"
    assert "num_env_runners=2" in refused["message"] and "rollout" in refused["message"]
    restored = out["restored"]
    assert restored["version"] == out["saved"]["version"]
    assert restored["weights"] == out["learner_after"]["weights"]
    assert restored["counters"] == out["saved"]["counters"]
    assert restored["next"][0]["trajectories"] == whole
    assert restored["next"][0]["version"] == out["saved"]["version"]  # its update's version
    assert elapsed < 600


# ----- without Ray: what the driver decides when runners are lost --------------------
CONFIG = SimpleNamespace(
    num_cpus_per_env_runner=1,
    num_gpus_per_env_runner=0,
    custom_resources_per_env_runner={"rollout": 1, "unused": 0},
)


def _node(node_id: str, **resources: float) -> dict:
    return {"NodeID": node_id, "NodeManagerAddress": "10.0.0.1", "Alive": True,
            "Resources": resources}  # fmt: skip


class _Group:
    """The env runner group as the driver's recovery sees it."""

    def __init__(self, healthy: int, total: int = 2):
        self.healthy, self.total, self.probes = healthy, total, 0

    def num_healthy_remote_env_runners(self) -> int:
        return self.healthy

    def num_remote_env_runners(self) -> int:
        return self.total

    def healthy_env_runner_ids(self) -> list[int]:
        return list(range(1, self.healthy + 1))

    def probe_unhealthy_env_runners(self) -> list[int]:
        self.probes += 1
        return []


class _Driver(SamplingMixin):
    def __init__(self, group: _Group):
        self.config, self.env_runner, self.env_runner_group = CONFIG, None, group
        self._lifetime = {"num_runner_restarts": 0}
        self._policy_version = 4


def test_a_runner_fits_a_node_only_with_all_it_asks_for(monkeypatch):
    assert cluster.runner_demand(CONFIG) == {"CPU": 1.0, "rollout": 1.0}
    monkeypatch.setattr(cluster, "alive_nodes", lambda: [_node("a" * 16, CPU=8.0, GPU=1.0)])
    problem = cluster.no_runner_host(CONFIG)
    assert problem is not None
    assert "{'CPU': 1.0, 'rollout': 1.0}" in problem
    assert "custom_resources_per_env_runner={'rollout': 1, 'unused': 0}" in problem
    assert "node aaaaaaaa (10.0.0.1): {'CPU': 8.0, 'rollout': 0.0}" in problem
    monkeypatch.setattr(cluster, "alive_nodes", lambda: [_node("b" * 16, CPU=1.0, rollout=1.0)])
    assert cluster.no_runner_host(CONFIG) is None
    monkeypatch.setattr(cluster, "alive_nodes", list)
    assert "the alive nodes have nothing" in cluster.no_runner_host(CONFIG)


def test_lost_runners_no_node_can_hold_are_not_waited_for(monkeypatch):
    monkeypatch.setattr(cluster, "alive_nodes", lambda: [_node("c" * 16, CPU=4.0)])
    # One runner left: it takes every share, and no probe sits out its timeout.
    group = _Group(healthy=1)
    assert _Driver(group).restore_env_runners(group) == []
    assert group.probes == 0
    # None left: stop, naming the resources.
    group = _Group(healthy=0)
    with pytest.raises(
        RunnerFailure, match=r"every env runner is lost, and no alive node.*rollout"
    ):
        _Driver(group).restore_env_runners(group)
    with pytest.raises(RunnerFailure, match=r"no healthy env runner is left: no alive node"):
        _Driver(group)._runner_ids()
    # A node that could hold a runner: the lost one is probed for (Ray restarts it there).
    monkeypatch.setattr(cluster, "alive_nodes", lambda: [_node("d" * 16, CPU=4.0, rollout=1.0)])
    group = _Group(healthy=1)
    _Driver(group).restore_env_runners(group)
    assert group.probes == 1
    # Nothing lost: no question to the cluster at all.
    monkeypatch.setattr(cluster, "alive_nodes", lambda: pytest.fail("asked the cluster"))
    group = _Group(healthy=2)
    _Driver(group).restore_env_runners(group)
    assert group.probes == 1


@pytest.mark.slow
def test_rllib_train_refuses_runners_no_node_can_hold(tmp_path):
    experiment = tmp_path / "exp.yaml"
    config = tiny_dict(num_env_runners=1, custom_resources_per_env_runner={"rollout": 1})
    experiment.write_text(
        json.dumps(
            {"pinned": {"run": "StarPO", "stop": {"training_iteration": 1}, "config": config}}
        )
    )
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "train", "file", str(experiment),
         "--num-cpus", "1", "--storage-path", str(tmp_path / "results")],
        cwd=tmp_path, env=private_env(tmp_path), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "experiment 'pinned' asks for num_env_runners=1" in proc.stderr, proc.stderr[-2000:]
    assert "{'CPU': 1.0, 'rollout': 1.0}" in proc.stderr, proc.stderr[-2000:]
    assert time.monotonic() - start < 120
    assert not (tmp_path / "results" / "pinned").exists()  # no trial was started
