"""How far the rollout engine's log-probs are from the learner's, per engine and dtype.

Trains a few iterations per case and prints, per case, what every update logs
(``log_rollout_mismatch``): the k3 estimate of KL(engine || learner) and the
largest |log-prob difference| over the tokens sampled with the learner's own
weights, the KL over all tokens (with the policy's drift since sampling when
sampling is asynchronous) and the tokens' policy lag.

Cases (``--cases``, comma-separated):

- ``hf-fp32``: the HF engine in float32 beside the float32 learner (the same
  numbers up to summation order: about 0);
- ``hf-bf16``: the HF engine with bfloat16 weights (``engine_dtype``) beside the
  float32 learner;
- ``vllm``, ``vllm-bf16``: vLLM's engine in float32 or bfloat16 (run them in
  the vLLM environment: ``.venv-vllm``);
- ``hf-fp32-async``: ``hf-fp32`` with ``async_rollouts`` (one runner actor):
  every token is a policy version old, so no token measures the engines' gap
  alone and the KL over all tokens is the drift.

    python bench/bench_mismatch.py --cases hf-fp32,hf-bf16,hf-fp32-async
    .venv-vllm/bin/python bench/bench_mismatch.py --cases vllm,vllm-bf16
    python bench/bench_mismatch.py --llm smollm2-135m-instruct --cases hf-fp32,hf-bf16 \
        --iterations 2 --config '{"env_groups": 2, "max_tokens_per_microbatch": 2048}'
"""

from __future__ import annotations

import argparse
import json
import math
import sys

CASES = {
    "hf-fp32": {},
    "hf-bf16": {"engine_dtype": "bfloat16"},
    "vllm": {"engine": "vllm", "vllm_enforce_eager": True},
    "vllm-bf16": {"engine": "vllm", "vllm_enforce_eager": True, "engine_dtype": "bfloat16"},
    "hf-fp32-async": {"num_env_runners": 1, "async_rollouts": True},
}
KEYS = (
    "rollout_mismatch_kl",
    "rollout_mismatch_max_abs",
    "rollout_mismatch_tokens",
    "off_policy_kl",
    "token_lag_mean",
)


def run_case(name: str, args) -> dict:
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    config = {
        "env": args.env,
        "llm": args.llm,
        "env_groups": 8,
        "group_size": 4,
        "max_turns": 3,
        "max_new_tokens": 24,
        "minibatch_size": 32,
        "advantage_estimator": "grpo",
        "filter_keep_ratio": 1.0,
        "lr": 1e-4,
        "seed": args.seed,
        **json.loads(args.config or "{}"),
        **CASES[name],
    }
    algo = StarPOConfig.from_user_dict(config).build_algo()
    rows = []
    try:
        for _ in range(args.iterations):
            learner = algo.train()["learners"]["default_policy"]
            # An update with no token sampled by the learner's own weights logs no
            # same-weights figure (RLlib then reports NaN for it).
            row = {k: float(learner[k]) for k in KEYS if k in learner}
            rows.append({k: v for k, v in row.items() if not math.isnan(v)})
    finally:
        algo.stop()
    same = [
        r for r in rows if r.get("rollout_mismatch_tokens", 0) > 0 and "rollout_mismatch_kl" in r
    ]
    out = {
        "case": name,
        "llm": args.llm,
        "iterations": len(rows),
        "off_policy_kl_mean": sum(r["off_policy_kl"] for r in rows) / len(rows),
        "token_lag_mean": sum(r["token_lag_mean"] for r in rows) / len(rows),
        "updates_with_same_weight_tokens": len(same),
    }
    if same:
        out["rollout_mismatch_kl_mean"] = sum(r["rollout_mismatch_kl"] for r in same) / len(same)
        out["rollout_mismatch_max_abs"] = max(r["rollout_mismatch_max_abs"] for r in same)
        out["tokens_per_update"] = sum(r["rollout_mismatch_tokens"] for r in same) / len(same)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default="hf-fp32,hf-bf16,hf-fp32-async")
    parser.add_argument("--llm", default="builtin")
    parser.add_argument("--env", default="ragen/FrozenLakeNoSlip-v0")
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", default=None, help="JSON object merged into the config")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; known: {sorted(CASES)}")
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    for name in args.cases.split(","):
        print(json.dumps(run_case(name, args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
