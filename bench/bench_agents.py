"""An agent program's rollout against its gymnasium env's, on the same task and engine.

Two env runners in one process, each with its own HF engine holding the same
built-in model: one plays the env (``ragen/Bandit-v0`` or ``ragen/SearchQA-v0``)
in its own loop, the other calls the matching agent program of
``tuned_examples/agents/`` (the `openai` client over HTTP to the runner's
gateway) for each trajectory. They sample a batch of ``--groups`` x
``--group-size`` trajectories in turn, ``--repeats`` times, and the bench
prints the median seconds per batch and per model call (turn) of each, and
their ratio, as JSON:

    python bench/bench_agents.py                      # the bandit: one turn each
    python bench/bench_agents.py --task search        # up to 5 turns each

"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: task -> (env id, its max_turns, the agent's file, max_new_tokens)
TASKS = {
    "bandit": ("ragen/Bandit-v0", 1, "bandit_agent.py", 24),
    "search": ("ragen/SearchQA-v0", 5, "search_agent.py", 48),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="bandit")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)

    import torch

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    torch.set_num_threads(args.threads)
    env, max_turns, agent_file, max_new_tokens = TASKS[args.task]
    agent = ROOT / "tuned_examples" / "agents" / agent_file
    common = {
        "llm": "builtin",
        "env_groups": args.groups,
        "group_size": args.group_size,
        "minibatch_size": args.group_size,
        "max_context_tokens": 2048,
        "seed": 0,
        "max_new_tokens": max_new_tokens,
    }
    configs = {
        "env": {**common, "env": env, "max_turns": max_turns},  # the agent decides its own
        "agent": {**common, "agent": f"{agent}:run", "agent_tasks": f"{agent}:tasks"},
    }
    runners = {}
    for name, values in configs.items():
        config = StarPOConfig.from_user_dict(values)
        config.check_values()
        runners[name] = LLMEnvRunner(config=config, worker_index=0)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    turns: dict[str, list[int]] = {name: [] for name in runners}
    for runner in runners.values():
        runner.sample()  # warm-up: the gateway starts, the tasks and the index load
    for _ in range(args.repeats):
        for name, runner in runners.items():
            start = time.perf_counter()
            trajs = runner.sample()
            seconds[name].append(time.perf_counter() - start)
            turns[name].append(sum(t.num_turns for t in trajs))
    out = {"task": args.task, "trajectories": args.groups * args.group_size}
    for name in runners:
        per_turn = [s / max(n, 1) for s, n in zip(seconds[name], turns[name], strict=True)]
        out[name] = {
            "batch_s": round(statistics.median(seconds[name]), 3),
            "turns": round(statistics.median(turns[name]), 1),
            "per_turn_ms": round(1000 * statistics.median(per_turn), 2),
        }
    out["agent_over_env_per_turn"] = round(
        out["agent"]["per_turn_ms"] / out["env"]["per_turn_ms"], 2
    )
    for runner in runners.values():
        runner.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
