"""Agent programs as the rollout: each trajectory is one call of the user's agent
function, whose chat completions requests the runner's gateway answers and records.

An experiment names its agent and its tasks instead of an env::

    agent: my_agents.search:run              # or path/to/file.py:run
    agent_tasks: my_agents.search:tasks      # or a .jsonl file of task records

- ``agent`` is called as ``run(base_url, api_key, task)`` in a thread of the env
  runner, once per trajectory; all the trajectories of a batch (the N of each
  group included) run at once. An ``async def`` agent runs in its own event
  loop. It talks to the policy at ``base_url`` (an OpenAI-compatible
  ``/v1``) with ``api_key``, which ties its requests to its trajectory, and
  returns the reward: a number, or a dict with ``reward`` (added to the last
  turn), ``turn_rewards`` (one per model call) and ``success``.
- ``agent_tasks`` is called as ``tasks(split)`` with ``"train"`` or ``"eval"``
  and returns a list of task records (any picklable values, usually dicts); a
  ``.jsonl`` file holds one JSON record a line, those with ``"split":
  "eval"`` held out for evaluation. Group g of a batch plays the task its
  seed picks, all N of its trajectories the same one.

An agent that raises, returns something else, outlasts ``agent_timeout_s`` or
never calls the model ends its trajectory as ``env_error`` with the reason, so
its group is dropped from the update and counted under
``max_env_error_share``, as an env's error is. A request after its trajectory
ended is refused (409).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ragen_rllib.agents.calls import _Call, _ProcessCall, load_callable
from ragen_rllib.agents.conversation import RESTART_REASONS
from ragen_rllib.agents.gateway import Gateway, GatewayLimits
from ragen_rllib.agents.outcomes import (  # noqa: F401 - agent_outcome is part of the API
    COUNTS,
    RewardOutOfBounds,
    agent_outcome,
    ended_by,
    failed,
)
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)

SPLITS = ("train", "eval")
#: the gateway's counts logged per batch (``agents/<name>``): tool calls that did not
#: parse, max_tokens clamped, answers ended by a stop sequence, messages refused for a
#: chat control token, bodies and headers that did not arrive in time, connections
#: closed at the cap
GATEWAY_COUNTS = (
    "tool_parse_failures", "max_tokens_clamped", "stop_sequences", "control_tokens_refused",
    "body_timeouts", "header_timeouts", "connections_evicted", "connections_refused",
)  # fmt: skip


def resolve_path(spec: Any) -> Any:
    """A file-based ``agent``/``agent_tasks`` with its path made absolute (the env
    runners may start in another directory); anything else as it is."""
    if not isinstance(spec, str):
        return spec
    where, colon, name = spec.partition(":")
    if where.endswith((".py", ".jsonl")) and not Path(where).is_absolute():
        return str(Path(where).resolve()) + colon + name
    return spec


def load_tasks(spec: str, split: str) -> list[Any]:
    """The task records of ``split`` ("train" or "eval"); ValueError naming
    ``agent_tasks`` when they cannot be had or there are none."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, not {split!r}")
    if isinstance(spec, str) and spec.endswith(".jsonl"):
        try:
            with open(spec, encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError) as err:
            raise ValueError(
                f"config agent_tasks={spec!r} is invalid: {type(err).__name__}: {err}"
            ) from err
        tasks = [
            r for r in records
            if (r.get("split", "train") if isinstance(r, dict) else "train") == split
        ]  # fmt: skip
    else:
        function = load_callable(spec, "agent_tasks")
        try:
            tasks = list(function(split))
        except Exception as err:  # noqa: BLE001 - the user's code
            raise ValueError(
                f"config agent_tasks={spec!r} is invalid: calling it with {split!r} raised "
                f"{type(err).__name__}: {err}"
            ) from err
    if not tasks:
        raise ValueError(
            f"config agent_tasks={spec!r} is invalid: it gives no {split!r} tasks "
            "(training needs 'train' ones, evaluation 'eval' ones)"
        )
    return tasks


class AgentRollouts:
    """Plays a batch of trajectories by calling the agent, behind a gateway of this
    runner's engine (started on first use, and again if its server has died)."""

    def __init__(self, config, engine, tokenizer) -> None:
        self.config, self.engine, self.tokenizer = config, engine, tokenizer
        self.agent = load_callable(config.agent, "agent")
        self._tasks: dict[str, list[Any]] = {}
        self.gateway: Gateway | None = None
        self.base_url = ""
        self.restarts = 0
        self._hung: list[threading.Thread] = []  # thread-mode agent calls past their timeout
        self._hung_warned = 0
        #: where agent calls run: agent_isolation, until agent_max_hung_threads threads hang
        self.isolation = str(config.agent_isolation)

    def _count_hung(self, calls: list[threading.Thread]) -> int:
        """Agent threads still running past their timeout (thread isolation cannot end
        them), this batch's and earlier ones'; warned as they double."""
        self._hung = [t for t in [*self._hung, *calls] if t.is_alive()]
        n = len(self._hung)
        bound = int(self.config.agent_max_hung_threads)
        if self.isolation == "thread" and n >= bound:
            self.isolation = "process"
            logger.warning(
                "%d agent threads are still running past agent_timeout_s, "
                "agent_max_hung_threads is %d: this runner's later agent calls run in worker "
                "processes, killed at their timeout (agent_isolation: process)",
                n,
                bound,
            )
        elif n >= max(4, 2 * self._hung_warned) and self.isolation == "thread":
            self._hung_warned = n
            logger.warning(
                "%d agent threads are still running past agent_timeout_s (a thread cannot be "
                "stopped); set agent_isolation: process to end hung agents at their timeout",
                n,
            )
        return n

    def tasks(self, split: str) -> list[Any]:
        if split not in self._tasks:
            self._tasks[split] = load_tasks(self.config.agent_tasks, split)
        return self._tasks[split]

    def _serving(self, temperature: float, top_p: float, max_new_tokens: int) -> Gateway:
        cfg = self.config
        limits = GatewayLimits(
            model=str(cfg.llm),
            temperature=float(temperature),
            top_p=float(top_p),
            max_new_tokens=int(max_new_tokens),
            max_context_tokens=int(cfg.max_context_tokens),
            answer_timeout_s=float(cfg.agent_timeout_s),
            max_connections=int(cfg.agent_gateway_max_connections),
            header_timeout_s=float(cfg.agent_gateway_header_timeout_s),
            body_timeout_s=float(cfg.agent_gateway_body_timeout_s),
            max_tokens_over_limit=str(cfg.agent_max_tokens_over_limit),
        )
        if self.gateway is not None and not self.gateway.serving:
            logger.warning("the agents' gateway stopped; starting a new one")
            self.gateway.shutdown()
            self.gateway = None
            self.restarts += 1
        if self.gateway is None:
            self.gateway = Gateway(self.engine, self.tokenizer, limits)  # reseeded per batch
            self.base_url = self.gateway.serve(
                host=cfg.agent_gateway_host, url=cfg.agent_gateway_url
            )
        self.gateway.limits = limits  # this batch's sampling (evaluation's temperature)
        return self.gateway

    def run(
        self,
        seeds: list[int],
        groups: list[int],
        params,
        split: str = "train",
        sample_seed: int = 0,
    ) -> tuple[list[Trajectory], dict[str, int]]:
        """One trajectory per seed (the task ``tasks[seed % len(tasks)]``), the
        engine's sampling seeded from ``sample_seed``, and the batch's counts (logged
        under ``agents/``: errors, timeouts, calls without a model request, context
        overflows, tool-call parse failures, gateway restarts). Returns once every
        agent has returned or timed out and the engine runs none of their requests."""
        gateway = self._serving(params.temperature, params.top_p, params.max_new_tokens)
        gateway.reseed(sample_seed)
        counts_before = dict(gateway.counts)
        calls, trajs = self._open_calls(gateway, seeds, groups, self.tasks(split))
        for _, call in calls:
            call.start()
        # Every agent's time starts once all are running (starting a batch of processes
        # takes a while on a busy machine); before that, a request's wait is bounded by
        # agent_timeout_s alone.
        limit = float(self.config.agent_timeout_s)
        deadline = time.monotonic() + limit
        for key, _ in calls:
            gateway.set_deadline(key, deadline)
        counts = self._close_calls(gateway, calls, deadline)
        # A request that timed out may still be generating: the engine is the runner's
        # again (new weights, sleep, cache) only once it is done.
        idle_wait = max(_IDLE_WAIT_S, limit)
        if not gateway.wait_idle(timeout=idle_wait):
            raise RuntimeError(
                f"the rollout engine did not finish an agent's request within {idle_wait:g} s "
                "of the batch's end"
            )
        self.engine.clear_cache()  # the batch's conversations (the gateway's own clear at
        # its last close can come before a timed-out request's late generation)
        out = {name: counts[name] for name in COUNTS}
        # The gateway's own counts, this batch's part: what it changed or refused in the
        # requests, and segments restarted by why (a context the policy sees again).
        for name in (*GATEWAY_COUNTS, *(f"segment_restarts_{r}" for r in RESTART_REASONS)):
            out[name] = gateway.counts[name] - counts_before.get(name, 0)
        out["gateway_restarts"] = self.restarts
        out["agents_killed"] = sum(bool(getattr(call, "killed", False)) for _, call in calls)
        out["process_calls"] = sum(isinstance(call, _ProcessCall) for _, call in calls)
        out["hung_threads"] = self._count_hung([c for _, c in calls if isinstance(c, _Call)])
        return trajs, out

    def _open_calls(
        self, gateway: Gateway, seeds: list[int], groups: list[int], tasks: list[Any]
    ) -> tuple[list[tuple[str, _Call]], list[Trajectory]]:
        """A trajectory open at the gateway and an agent call (not started) per seed."""
        if self.isolation == "process":
            _ProcessCall.ready()  # the forkserver's start is not the agents' time
        calls, trajs = [], []
        for seed, group in zip(seeds, groups, strict=True):
            task = tasks[seed % len(tasks)]
            traj = Trajectory(
                env_id=self.config.agent,
                env_name=_task_name(task, self.config.agent),
                seed=seed,
                group=group,
                policy_version=self.engine.policy_version,
            )
            key = gateway.open(traj)
            if self.isolation == "process":
                call = _ProcessCall(self.config.agent, self.base_url, key, task)
            else:
                call = _Call(self.agent, self.base_url, key, task)
            calls.append((key, call))
            trajs.append(traj)
        return calls, trajs

    def _close_calls(
        self, gateway: Gateway, calls: list[tuple[str, _Call]], deadline: float
    ) -> Counter:
        """Wait for each call until the deadline, close its trajectory at the gateway
        and count how it ended."""
        limit = float(self.config.agent_timeout_s)
        counts: Counter = Counter()
        for key, call in calls:
            call.join(max(0.0, deadline - time.monotonic()))
            traj, requests = gateway.close(key)
            try:
                counts[ended_by(
                    traj, call, requests, limit, float(self.config.agent_max_abs_reward),
                    gateway.engine_failures_of(key),
                )] += 1  # fmt: skip
            except Exception as err:  # noqa: BLE001 - whatever the agent's value does
                counts["agent_errors"] += 1
                failed(traj, f"agent's result could not be read: {type(err).__name__}")
        return counts

    def shutdown(self) -> None:
        if self.gateway is not None:
            self.gateway.shutdown()
            self.gateway = None


def _task_name(task: Any, agent: str) -> str:
    if isinstance(task, dict) and isinstance(task.get("env"), str):
        return task["env"]
    return agent.rpartition(":")[2]


#: the least time a batch waits for the engine to finish its agents' last requests
_IDLE_WAIT_S = 120.0
