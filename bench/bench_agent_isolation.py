"""What a flaky agent leaves behind: threads, open files and memory of the runner's
process over many trajectories, with ``agent_isolation: thread`` and ``process``.

A built-in-model runner plays ``--batches`` batches of ``--batch`` trajectories with
an agent of which one call in ``--hang-every`` (0: none) sleeps past ``agent_timeout_s``
(``--timeout``) and the others ask the model once. After the first batch and after
the last, it reads the process's threads, open descriptors and resident memory,
and the counts the runner logged. Prints JSON, one entry per isolation:

    python bench/bench_agent_isolation.py --batches 50 --batch 20
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

AGENT = """
import time
from openai import OpenAI

def tasks(split):
    return [{"hang": HANG_EVERY > 0 and i % HANG_EVERY == 0} for i in range(max(HANG_EVERY, 1))]

def run(base_url, api_key, task):
    if task["hang"]:
        time.sleep(3600)
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    reply = client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Say up."}])
    return float("up" in (reply.choices[0].message.content or ""))
"""


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _state() -> dict:
    return {
        "threads": threading.active_count(),
        "fds": len(os.listdir("/proc/self/fd")),
        "rss_mib": round(_rss_mib(), 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--batch", type=int, default=20)
    parser.add_argument("--hang-every", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=1.0)
    parser.add_argument("--isolation", nargs="+", default=["thread", "process"])
    args = parser.parse_args(argv)

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.engines.base import SamplingParams
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    folder = Path(tempfile.mkdtemp(prefix="agent-isolation-"))
    agent = folder / "flaky_agent.py"
    agent.write_text(AGENT.replace("HANG_EVERY", str(args.hang_every)))
    out = {"batches": args.batches, "batch": args.batch, "hang_every": args.hang_every}
    for isolation in args.isolation:
        cfg = StarPOConfig.from_user_dict({
            "agent": f"{agent}:run", "agent_tasks": f"{agent}:tasks", "llm": "builtin",
            "model_dtype": "float32", "env_groups": args.batch, "group_size": 1,
            "max_new_tokens": 8, "agent_timeout_s": args.timeout, "agent_isolation": isolation,
            "max_env_error_share": 1.0,
        })  # fmt: skip
        runner = LLMEnvRunner(config=cfg, worker_index=0)
        params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
        seeds = list(range(args.batch))
        start = time.perf_counter()
        counts = {"agent_timeouts": 0, "agents_killed": 0}
        first = None
        for b in range(args.batches):
            runner.run_episodes(seeds, seeds, params, sample_seed=b)
            metrics = runner.get_metrics()["agents"]
            for key in counts:
                counts[key] += int(metrics.get(key, 0))
            hung = int(metrics.get("hung_threads", 0))
            if first is None:
                first = _state()
        out[isolation] = {
            "after_first_batch": first,
            "after_last_batch": _state(),
            "hung_threads_at_end": hung,
            "trajectories": args.batches * args.batch,
            **counts,
            "seconds": round(time.perf_counter() - start, 1),
        }
        runner.stop()
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
