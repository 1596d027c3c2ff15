"""Weight-sync time against model size: learner weights into a remote runner's engine.

What one sync does in training: the learner's actor weights (a state dict of CPU
tensors) go into Ray's object store once (``ray.put``), and each runner actor
fetches them and loads them into its rollout engine in place (``ray.get`` +
``load_state_dict``), with no engine restart. This script times those stages
for the built-in model and for a Qwen2.5-0.5B-shaped model made from a config
with random weights (no download), with one runner actor on this machine.

    python bench/bench_weight_sync.py                 # both models, 5 syncs each
    python bench/bench_weight_sync.py --models builtin

The median of ``--repeats`` syncs is printed per stage.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time

# Qwen2.5-0.5B's shape (its published config), random weights.
QWEN_05B_SHAPE = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
}


def model_dir(name: str, root: str) -> str:
    if name == "builtin":
        from ragen_rllib.models.resolve import resolve_model

        return resolve_model("builtin")
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**QWEN_05B_SHAPE))
    path = f"{root}/{name}"
    model.save_pretrained(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="builtin,qwen2.5-0.5b-shape")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)

    import ray
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_rllib.distributed.wire import from_wire, to_wire

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Runner:
        def __init__(self, path: str):
            from ragen_rllib.engines.hf_engine import HFEngine

            self.engine = HFEngine(path, eos_token_id=0, pad_token_id=0)

        def load(self, state, version: int) -> float:
            start = time.perf_counter()
            weights = from_wire(ray.get(state[0]))  # the runner fetches the object itself
            self.engine.load_weights(weights, version)
            return time.perf_counter() - start

    figures = []
    with tempfile.TemporaryDirectory() as root:
        for name in args.models.split(","):
            path = model_dir(name, root)
            learner = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            params = sum(p.numel() for p in learner.parameters())
            runner = Runner.remote(path)
            stages: dict[str, list[float]] = {"state_dict_s": [], "put_s": [], "load_s": []}
            totals = []
            for version in range(1, args.repeats + 1):
                with torch.no_grad():
                    for p in learner.parameters():  # an "update"
                        p.add_(1e-6)
                start = time.perf_counter()
                # As LLMRLModule.actor_weights: a tied LM head is not sent.
                state = {
                    k: v.detach().cpu()
                    for k, v in learner.state_dict().items()
                    if not (learner.config.tie_word_embeddings and k == "lm_head.weight")
                }
                t1 = time.perf_counter()
                ref = ray.put(to_wire(state))  # as the algorithm sends them
                t2 = time.perf_counter()
                load = ray.get(runner.load.remote([ref], version))
                end = time.perf_counter()
                stages["state_dict_s"].append(t1 - start)
                stages["put_s"].append(t2 - t1)
                stages["load_s"].append(load)
                totals.append(end - start)
            nbytes = sum(v.numel() * v.element_size() for v in state.values())
            row = {
                "model": name,
                "parameters_m": round(params / 1e6, 2),
                "state_mib": round(nbytes / 2**20, 1),
                **{k: round(statistics.median(v), 4) for k, v in stages.items()},
                "sync_total_s": round(statistics.median(totals), 4),
            }
            figures.append(row)
            print(json.dumps(row), flush=True)
            ray.kill(runner)
            del learner, state, ref
    ray.shutdown()
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
