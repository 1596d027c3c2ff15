"""One GRPO iteration, this project's StarPO against TRL's GRPOTrainer, in one process.

The same model (``--llm``: the built-in one by default, or any the config takes,
e.g. ``smollm2-135m-instruct``), the same Bandit first prompt (as the env runner
renders it, chat template and prefill included), P prompts x N generations (8 x 16
by default), at most 32 new tokens, one
optimizer step per iteration, no KL term (TRL's ``beta=0``), no filtering. The
two run in alternating blocks of ``--steps`` iterations (the first of each block
is a warm-up and not counted); the figure is each side's median seconds per
iteration, and their ratio. Ours includes sampling, the update and the weight
sync into the rollout engine; TRL's includes its generation and its update.
Each side's stages are printed too (TRL's: generation with scoring, and the
rest of its step, mostly the loss's forward and backward passes).
TRL runs without activation checkpointing (its default is on), as ours does,
unless ``--trl-checkpointing`` is given: where its full-batch step does not fit in
memory without it (SmolLM2 at 8 x 16 on 24 GiB), checkpointing is what TRL's
user would run.

    pip install -e ".[bench]"           # TRL, for this bench only
    python bench/bench_vs_trl.py
    python bench/bench_vs_trl.py --llm smollm2-135m-instruct --groups 4 --group-size 8
    python bench/bench_vs_trl.py --llm smollm2-135m-instruct --trl-checkpointing
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time


def ours_block(algo, steps: int) -> tuple[list[float], dict[str, list[float]]]:
    times, stages = [], {"sample_s": [], "update_s": [], "sync_s": []}
    for _ in range(steps):
        start = time.perf_counter()
        result = algo.train()
        times.append(time.perf_counter() - start)
        timing = result["timing"]
        stages["sample_s"].append(timing["rollout_s"])
        stages["update_s"].append(timing["update_s"])
        stages["sync_s"].append(timing["sync_s"])
    return times[1:], {k: v[1:] for k, v in stages.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="iterations per block")
    parser.add_argument("--blocks", type=int, default=2, help="alternating blocks per side")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--llm", default="builtin")
    parser.add_argument("--groups", type=int, default=8, help="P")
    parser.add_argument("--group-size", type=int, default=16, help="N")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument(
        "--trl-checkpointing", action="store_true", help="TRL's activation checkpointing on"
    )
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)

    import ray
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.warmup.format_warmup import model_path

    groups, size, new_tokens = args.groups, args.group_size, args.max_new_tokens
    ray.init(num_cpus=args.threads, include_dashboard=False, log_to_driver=False)
    config = StarPOConfig.from_user_dict(
        {
            "env": "ragen/Bandit-v0",
            "llm": args.llm,
            "env_groups": groups,
            "group_size": size,
            "max_turns": 1,
            "max_new_tokens": new_tokens,
            "advantage_estimator": "grpo",
            "filter_keep_ratio": 1.0,
            "minibatch_size": groups * size,
            "num_epochs": 1,
            "lr": 1e-6,
            "seed": 0,
        }
    )
    algo = config.build_algo()

    # TRL gets the same first prompt as text (checked to encode back to the same ids)
    # and a reward in the same spirit as the env's.
    runner: LLMEnvRunner = algo.env_runner
    first = runner.sample()[0]
    prompt_ids = first.segments[0].input_ids[: first.turn_spans[0][1]]
    path = model_path(config)
    tok = AutoTokenizer.from_pretrained(path)
    prompt = tok.decode(prompt_ids)
    assert tok.encode(prompt, add_special_tokens=False) == prompt_ids, "prompt does not round-trip"

    def reward(completions, **kwargs):
        return [float("Dragon" in c) for c in completions]

    times_trl: list[float] = []
    generate_trl: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times_trl.append(time.perf_counter() - self.start)

    fields = getattr(GRPOConfig, "__dataclass_fields__", {})
    checkpointing_key = "activation_checkpointing"
    if checkpointing_key not in fields:  # older TRL / transformers
        checkpointing_key = "gradient_checkpointing"

    def trl_block() -> list[float]:
        before = len(times_trl)
        trainer = GRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
            reward_funcs=reward,
            args=GRPOConfig(
                output_dir=tempfile.mkdtemp(),
                use_cpu=True,
                bf16=False,
                per_device_train_batch_size=groups * size,
                num_generations=size,
                generation_batch_size=groups * size,
                max_completion_length=new_tokens,
                beta=0.0,
                learning_rate=1e-6,
                # TRL checkpoints activations by default; ours does not here.
                **{checkpointing_key: args.trl_checkpointing},
                max_steps=args.steps,
                logging_steps=10**6,
                save_strategy="no",
                report_to=[],
                disable_tqdm=True,
                dataloader_num_workers=0,
            ),
            train_dataset=Dataset.from_dict({"prompt": [prompt] * (groups * args.steps)}),
            processing_class=tok,
            callbacks=[Clock()],
        )
        # TRL's generation and scoring stage, timed inside its step.
        generate_and_score = trainer._generate_and_score_completions

        def timed(*a, **k):
            start = time.perf_counter()
            out = generate_and_score(*a, **k)
            generate_trl.append(time.perf_counter() - start)
            return out

        trainer._generate_and_score_completions = timed
        gen_before = len(generate_trl)
        trainer.train()
        del generate_trl[gen_before]  # the warm-up step's
        return times_trl[before + 1 :]

    ours, trl_times = [], []
    stages: dict[str, list[float]] = {"sample_s": [], "update_s": [], "sync_s": []}
    for _ in range(args.blocks):
        trl_times += trl_block()
        t, s = ours_block(algo, args.steps)
        ours += t
        for k, v in s.items():
            stages[k] += v
    algo.stop()
    med_ours, med_trl = statistics.median(ours), statistics.median(trl_times)
    trl_rest = [t - g for t, g in zip(trl_times, generate_trl, strict=True)]
    figures = {
        "setup": f"{args.llm}, Bandit first prompt ({len(prompt_ids)} tokens), "
        f"{groups} x {size}, <= {new_tokens} new tokens, {args.threads} threads, "
        f"TRL checkpointing {'on' if args.trl_checkpointing else 'off'}",
        "ours_s_per_iteration": round(med_ours, 3),
        "trl_s_per_step": round(med_trl, 3),
        "ours_over_trl": round(med_ours / med_trl, 2),
        "ours_stages_median_s": {k: round(statistics.median(v), 3) for k, v in stages.items()},
        "trl_stages_median_s": {
            "generate_and_score_s": round(statistics.median(generate_trl), 3),
            "rest_of_step_s": round(statistics.median(trl_rest), 3),
        },
        "samples": {"ours": len(ours), "trl": len(trl_times)},
    }
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
