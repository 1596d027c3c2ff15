"""Throughput and memory of a few training iterations on one device, against the planner.

Trains a tuned example (``--file``; the Sokoban setup,
``tuned_examples/sokoban_starpo.yaml``, by default) in one process, colocated
(learner and engine on the same device, the engine sleeping during each
update), for ``--iterations`` after one warm-up, and prints:

- rollout tokens/s (generated tokens over the sampling time) and learner
  tokens/s (the tokens of the trajectories the update trained on, after rollout
  filtering, over the update time);
- the learner's model FLOPs utilisation: the update's model FLOPs per trained
  token (:func:`update_flops_per_token`: the actor's and the critic's passes,
  6 x weights each, 8 x with gradient checkpointing, fewer under LoRA) x
  learner tokens/s over the device's peak (``--peak-tflops``; known for
  H100/H200/A100 bf16);
- the peak device memory (CUDA's peak allocated and reserved, over the
  iteration and within its rollout and its update; on CPU the process's peak
  resident memory) beside the memory planner's estimate for the same config,
  per phase, at its worst case (every sequence at the context limit) and at the
  longest trajectory measured, and their ratios;
- the weight push (learner to engine, wake included) and the engine's release;
- the wall time of an iteration.

    python bench/bench_gpu.py                   # a GPU, the 0.5B shape (random weights), bf16
    python bench/bench_gpu.py --model builtin --device cpu --iterations 2 --tiny   # the CPU path

``--model qwen05b`` builds a Qwen2.5-0.5B-shaped model with random weights from
its config (no download); any local model folder, ``.gguf`` file, named model
(``smollm2-135m-instruct``) or hub id works too. ``--config '{"lora_rank": 64}'``
overrides the example's settings; ``--json PATH`` writes the figures to a file
as well. ``bench/gpu_run.sh`` runs the set of these that a GPU machine is
checked with.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
#: Dense bf16 peak TFLOP/s by device name (what the vendor's data sheet gives).
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}


def build_qwen05b(path: str) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ragen_rllib.models.resolve import resolve_model
    from ragen_rllib.planning.shapes import KNOWN_CONFIGS

    builtin = resolve_model("builtin")
    config = AutoConfig.from_pretrained(builtin)
    tokenizer = AutoTokenizer.from_pretrained(builtin)
    for key, value in KNOWN_CONFIGS["qwen/qwen2.5-0.5b"].items():
        setattr(config, key, value)
    # The built-in tokenizer's ids stay valid: its vocabulary is smaller than the shape's.
    config.head_dim = config.hidden_size // config.num_attention_heads
    config.layer_types = ["full_attention"] * config.num_hidden_layers
    config.max_position_embeddings = 32768
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)


def experiment_config(args) -> dict:
    exp = yaml.safe_load(Path(args.file).read_text())
    exp = next(iter(exp.values()))
    cfg = {**exp["config"], "env": exp["env"]}
    cfg.update(
        {
            "llm": args.model_path,
            "num_env_runners": 0,
            "num_learners": 0,
            # The learner in this process, on the GPU when there is one; the engine
            # beside it (colocated), sleeping during each update.
            "num_gpus_per_learner": 1 if args.device == "cuda" else 0,
            "rollout_device": args.device,
            "model_dtype": args.dtype,
            "eval_interval": 0,
        }
    )
    if args.model == "qwen05b":  # random weights: the shortest prompts do
        cfg["prompt_style"] = "compact"
    if args.tiny:  # the CPU smoke size
        cfg.update({"env_groups": 4, "group_size": 2, "max_turns": 2, "max_new_tokens": 16})
        cfg.update({"minibatch_size": 2, "max_context_tokens": 1024})
        if cfg.get("format_warmup_steps"):  # the warm-up still runs: one step of one example
            cfg.update({"format_warmup_steps": 1, "format_warmup_batch": 1})
    cfg.update(args.overrides)
    return cfg


def update_flops_per_token(config, shape) -> float:
    """Model FLOPs of one trained token in the update: per network of N weights
    (t of them trained), 2N forward, 2N for the backward's activation gradients
    and 2t for its weight gradients, 2N more when gradient checkpointing runs
    the forward again; the critic (a transformer without the LM head) adds its
    own, and its no-grad value pass 2N. Attention's score products are left out
    (a few percent at these lengths), and so are passes a config may add (a KL
    reference, the whole-batch rescoring, epochs after the first)."""
    rank = config.lora_rank

    def trained_pass(n: int, lora: int) -> float:
        t = lora if rank else n
        return 4 * n + 2 * t + (2 * n if config.gradient_checkpointing else 0)

    # The matrices a token passes: the blocks and the LM head (the embedding is a
    # lookup, so an untied model's input embedding costs nothing).
    actor = shape.backbone_params()
    adapters = shape.lora_params(rank) if rank else 0
    flops = trained_pass(actor, adapters)
    if config.uses_critic:
        critic = actor - shape.vocab * shape.hidden  # no LM head (a lookup is free)
        flops += trained_pass(critic, adapters) + 2 * critic
    return float(flops)


class Probe:
    """What one iteration's phases leave behind, by wrapping two calls in ``algo``:
    the longest trajectory sampled, what each update trained on (rollout filtering
    keeps a share of the sampled groups) and, on a GPU, CUDA's peak allocated and
    reserved bytes within each rollout and each update (the counters reset as
    each starts)."""

    def __init__(self, algo, torch, gpu: bool) -> None:
        self.cuda = torch.cuda if gpu else None
        self.longest = 0
        #: per update: the trajectories and tokens it trained on (after filtering)
        self.trained: list[tuple[int, int]] = []
        self.peaks: dict[str, list[int]] = {"rollout": [0, 0], "update": [0, 0]}
        algo._sample_fresh = self._wrap("rollout", algo._sample_fresh)
        group = algo.learner_group
        group.update = self._wrap("update", group.update)

    def _wrap(self, phase: str, call):
        def measured(*args, **kwargs):
            if self.cuda:
                self.cuda.synchronize()
                self.cuda.reset_peak_memory_stats()
            out = call(*args, **kwargs)
            if phase == "update":  # one learner: the trajectories themselves
                batch = kwargs["episodes"]
                self.trained.append((len(batch), sum(t.num_tokens for t in batch)))
            if phase == "rollout":
                self.longest = max([self.longest, *(t.num_tokens for t in out)])
            if self.cuda:
                self.cuda.synchronize()
                peak = self.peaks[phase]
                peak[0] = max(peak[0], self.cuda.max_memory_allocated())
                peak[1] = max(peak[1], self.cuda.max_memory_reserved())
            return out

        return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--file",
        default=str(HERE.parent / "tuned_examples" / "sokoban_starpo.yaml"),
        help="the tuned example to train (default: the Sokoban setup)",
    )
    parser.add_argument("--model", default="qwen05b", help="qwen05b, builtin, a folder or hub id")
    parser.add_argument("--config", default="{}", help="JSON overrides of the example's settings")
    parser.add_argument(
        "--build-dir",
        default=None,
        help="where --model qwen05b is built, and reused from when it is there already",
    )
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--peak-tflops", type=float, default=None)
    parser.add_argument("--tiny", action="store_true", help="a small batch (CPU smoke check)")
    args = parser.parse_args(argv)
    try:
        args.overrides = json.loads(args.config)
    except json.JSONDecodeError as exc:
        parser.error(f"--config is not JSON: {exc}")
    if not isinstance(args.overrides, dict):
        parser.error("--config must be a JSON object of settings")

    import ray
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: no GPU visible; use --device cpu for the CPU path", file=sys.stderr)
        return 2
    if args.model == "qwen05b":
        args.model_path = args.build_dir or tempfile.mkdtemp(prefix="qwen05b-")
        Path(args.model_path).parent.mkdir(parents=True, exist_ok=True)
        if not (Path(args.model_path) / "built").exists():  # not a half-built one
            staging = tempfile.mkdtemp(prefix="qwen05b-", dir=Path(args.model_path).parent)
            build_qwen05b(staging)
            (Path(staging) / "built").touch()
            shutil.rmtree(args.model_path, ignore_errors=True)
            os.replace(staging, args.model_path)
    else:
        from ragen_rllib.models.resolve import resolve_model

        args.model_path = resolve_model(args.model)
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.planning.memory import GIB
    from ragen_rllib.planning.placement import Hardware, plan
    from ragen_rllib.planning.shapes import load_shape

    user = experiment_config(args)
    config = StarPOConfig.from_user_dict(user)
    gpu = args.device == "cuda"
    ray.init(
        address="local", num_cpus=2, num_gpus=int(gpu), include_dashboard=False, log_to_driver=False
    )
    # The planner for this device: the learner and the engine beside it.
    shape = load_shape(args.model_path)
    if gpu:
        total = torch.cuda.get_device_properties(0).total_memory
        hardware = Hardware(1, 1, total, "this GPU")
    else:
        hardware = Hardware(1, 0, None, "this CPU")

    def planned(trajectory_tokens=None) -> dict[str, float]:
        laid = plan(config, shape, hardware, trajectory_tokens)
        phases = [(p, lines) for d in laid.devices for p, lines in d.phases.items()]
        return {p: round(sum(x.bytes for x in lines) / GIB, 2) for p, lines in phases}

    worst = planned()
    algo = config.build_algo()
    rows = []
    try:
        algo.train()  # warm-up: compilation, caches, the first allocations
        probe = Probe(algo, torch, gpu)
        peak_allocated = peak_reserved = 0
        for _ in range(args.iterations):
            if gpu:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            r = algo.train()
            wall = time.perf_counter() - start
            if gpu:  # since the update began (the probe resets the counters per phase)
                peak_allocated = max(peak_allocated, torch.cuda.max_memory_allocated())
                peak_reserved = max(peak_reserved, torch.cuda.max_memory_reserved())
            timing, rollout = r["timing"], r["rollout"]
            n = rollout["num_trajectories"]
            rows.append(
                {
                    "iteration_s": wall,
                    "rollout_s": timing["sample_wait_s"],
                    "update_s": timing["update_s"],
                    "sync_s": timing["sync_s"],
                    "release_s": r["timers"].get("engine_release", 0.0),
                    "generated": n * rollout["num_turns_mean"] * rollout["response_length_mean"],
                    "sampled": n,
                }
            )
            kept, tokens = probe.trained.pop() if probe.trained else (0, 0)
            rows[-1].update({"trained_trajectories": kept, "trained": tokens})
    finally:
        algo.stop()
    mean = {k: sum(row[k] for row in rows) / len(rows) for k in rows[0]}
    learner_tps = mean["trained"] / mean["update_s"]
    out = {
        "model": args.model,
        "file": Path(args.file).name,
        "overrides": args.overrides,
        "parameters_m": round(shape.params() / 1e6, 1),
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "dtype": args.dtype,
        "iterations": args.iterations,
        "iteration_s": round(mean["iteration_s"], 2),
        "rollout_s": round(mean["rollout_s"], 2),
        "update_s": round(mean["update_s"], 2),
        "sampled_trajectories": mean["sampled"],
        "trained_trajectories": mean["trained_trajectories"],
        "trained_tokens": round(mean["trained"]),
        "rollout_tokens_per_s": round(mean["generated"] / max(mean["rollout_s"], 1e-9), 1),
        "learner_tokens_per_s": round(learner_tps, 1),
        "weight_push_s": round(mean["sync_s"], 4),
        "engine_release_s": round(mean["release_s"], 4),
        "planned_peak_gib": max(worst.values()),
        "planned_worst_case_gib": worst,
    }
    if probe.longest:
        out["longest_trajectory_tokens"] = probe.longest
        out["planned_at_longest_gib"] = planned(probe.longest)
    peak = args.peak_tflops
    if peak is None and gpu:
        name = torch.cuda.get_device_name(0)
        peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if peak:
        out["peak_tflops"] = peak
        out["update_flops_per_token_g"] = round(update_flops_per_token(config, shape) / 1e9, 2)
        out["mfu"] = round(update_flops_per_token(config, shape) * learner_tps / (peak * 1e12), 4)
    if gpu:
        peak_allocated = max(peak_allocated, *(a for a, _ in probe.peaks.values()))
        peak_reserved = max(peak_reserved, *(r for _, r in probe.peaks.values()))
        out["peak_allocated_gib"] = round(peak_allocated / GIB, 2)
        out["peak_reserved_gib"] = round(peak_reserved / GIB, 2)
        out["measured_over_planned"] = round(out["peak_reserved_gib"] / out["planned_peak_gib"], 3)
        for phase, (allocated, reserved) in probe.peaks.items():
            out[f"{phase}_peak_allocated_gib"] = round(allocated / GIB, 2)
            out[f"{phase}_peak_reserved_gib"] = round(reserved / GIB, 2)
            tables = {"worst_case": worst, "at_longest": out.get("planned_at_longest_gib")}
            for label, table in tables.items():
                if table and table.get(phase):
                    ratio = reserved / GIB / table[phase]
                    out[f"{phase}_reserved_over_planned_{label}"] = round(ratio, 3)
    else:
        out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
