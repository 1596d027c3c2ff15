"""Where env runners can live: one runner's resource demand against the cluster's nodes.

RLlib asks Ray for each runner actor with ``num_cpus_per_env_runner``,
``num_gpus_per_env_runner`` and ``custom_resources_per_env_runner``. When no
alive node has all of them, Ray keeps the actor (or its restart after its node
died) pending for as long as it takes a node to join, and a call to it waits with
it. :func:`no_runner_host` tells the algorithm so, in words, before it waits: at
build time, and when a runner is lost with its node.
"""

from __future__ import annotations

from typing import Any

import ray

#: The settings that make up one runner's demand, in the order the message names them.
RUNNER_RESOURCE_KEYS = (
    "num_cpus_per_env_runner",
    "num_gpus_per_env_runner",
    "custom_resources_per_env_runner",
)


def runner_demand(config) -> dict[str, float]:
    """What Ray must find on one node for one runner: {resource: amount > 0}."""
    demand = {
        "CPU": float(config.num_cpus_per_env_runner or 0),
        "GPU": float(config.num_gpus_per_env_runner or 0),
        **{str(k): float(v) for k, v in (config.custom_resources_per_env_runner or {}).items()},
    }
    return {name: amount for name, amount in demand.items() if amount > 0}


def alive_nodes() -> list[dict[str, Any]]:
    """The cluster's alive nodes as Ray lists them (``NodeID``, ``Resources`` totals...)."""
    return [node for node in ray.nodes() if node.get("Alive")]


def fits(demand: dict[str, float], resources: dict[str, float]) -> bool:
    return all(resources.get(name, 0.0) >= amount for name, amount in demand.items())


def no_runner_host(config) -> str | None:
    """None when some alive node could hold one env runner (its total resources cover
    the demand; whether they are free now is Ray's business); otherwise a sentence
    naming the demand, the keys that set it and what each alive node has of it."""
    demand = runner_demand(config)
    nodes = alive_nodes()
    if any(fits(demand, node.get("Resources", {})) for node in nodes):
        return None
    settings = ", ".join(f"{key}={getattr(config, key)!r}" for key in RUNNER_RESOURCE_KEYS)
    have = "; ".join(
        f"node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '?')}): "
        + str({name: node.get("Resources", {}).get(name, 0.0) for name in demand})
        for node in nodes
    )
    return (
        f"no alive node of the Ray cluster has the resources one env runner needs, "
        f"{demand} ({settings}); the alive nodes have {have or 'nothing'}. Add a node "
        "that has them (ray start --address=<head>:6379 with --num-cpus/--num-gpus/"
        "--resources), or ask for less per runner"
    )
