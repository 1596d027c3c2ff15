"""A real model's speed on this machine, in one run: the matmul peak, the update's
model FLOPs utilisation, rollout against what the forward pass allows, HF against
vLLM, and one GRPO iteration against TRL's GRPOTrainer.

    python bench/bench_real_model.py                    # SmolLM2-135M-Instruct, every part
    python bench/bench_real_model.py --parts peak,update,forward
    python bench/bench_real_model.py --vllm-python .venv-vllm/bin/python --trl-steps 3

Parts (``--parts``, in this order):

- ``peak``: this machine's float32 matmul peak, the best GFLOP/s of square
  matrix products (1,024 to 4,096) and of the model's own layer shapes at
  2,048 tokens, at ``--threads`` torch threads.
- ``update``: the tuned example ``--file`` (the Bandit one by default) for
  ``--iterations`` StarPO iterations (the first not counted); the learner's
  update time, the tokens its transformer ran (a hook on the actor's input
  embedding counts them, padding included) and the response positions its LM
  head scored. Model FLOPs = 6 x (transformer parameters) x tokens + 6 x (LM
  head parameters) x scored positions (forward and backward; attention's
  score products are left out, a few percent at these lengths); utilisation =
  FLOP/s over the measured peak.
- ``forward``: what the forward pass allows a decoder: one decode step of B
  rows (the example's P x N) over a cache of L tokens (about its first
  prompt's length), best of several, in eval mode, so B / step time is the
  ceiling on generated tokens/s at that batch; and the prefill's tokens/s.
  With the engine's settings (float32, sdpa attention) and two it could use
  (eager attention; bfloat16 weights).
- ``rollout``: ``bench/bench_vllm.py`` run by ``--vllm-python`` (a venv with
  the vLLM CPU build: the README's vLLM install) on the example's env, P x N,
  turns and token budget: the HF engine and vLLM side by side, generated
  tokens/s each and their ratio. Skipped (and said) without that python.
- ``trl``: ``bench/bench_vs_trl.py`` with this model at 4 x 8 and at 8 x 16
  (``--trl-steps`` iterations a side, the first of each not counted); at 8 x 16
  with TRL's activation checkpointing on (its default), without which its step
  does not fit in 24 GiB; needs TRL (``pip install -e ".[bench]"``).

Each part prints its figures as it ends; the whole is printed as JSON at the end
(and written to ``--json``). Run it alone: every figure is a time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PARTS = ("peak", "update", "forward", "rollout", "trl")


def best_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_peak(shapes: list[tuple[int, int, int]], repeats: int = 5) -> dict:
    """Best float32 GFLOP/s over products of [m, k] x [k, n]."""
    import torch

    out = {}
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        seconds = best_seconds(lambda a=a, b=b: torch.mm(a, b), repeats)
        out[f"{m}x{k}x{n}"] = round(2 * m * k * n / seconds / 1e9, 1)
    return out


def transformer_params(model) -> tuple[int, int]:
    """(parameters of the decoder layers and final norm, parameters of the LM head)."""
    head = model.get_output_embeddings().weight.numel()
    embed = model.get_input_embeddings().weight.numel()
    total = sum(p.numel() for p in model.parameters())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return total - embed - (0 if tied else head), head


def example_config(args):
    """(name, config) of ``--file``'s first experiment, ``--config`` merged in."""
    from ragen_rllib.cli.experiments import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    config, _ = build_config(exp, json.loads(args.config) if args.config else {})
    return name, config


def part_update(args, peak_gflops: float) -> dict:
    import ray
    import torch

    name, config = example_config(args)
    config.eval_interval = 0
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    algo = config.build_algo()
    try:
        learner = algo.learner_group._learner
        if learner is None:
            raise SystemExit("the update part needs the learner in this process (num_learners 0)")
        actor = learner.module["default_policy"].actor
        counted = {"tokens": 0}

        def count(_module, inputs):
            counted["tokens"] += inputs[0].numel()

        hook = actor.get_input_embeddings().register_forward_pre_hook(count)
        body, head = transformer_params(actor)
        rows = []
        for i in range(args.iterations):
            counted["tokens"] = 0
            result = algo.train()
            if i == 0:
                continue
            timing = result["timing"]
            scored = result["learners"]["default_policy"]["response_tokens"]
            flops = 6 * body * counted["tokens"] + 6 * head * scored
            rows.append(
                {
                    "update_s": timing["update_s"],
                    "rollout_s": timing["rollout_s"],
                    "tokens": counted["tokens"],
                    "scored_positions": int(scored),
                    "model_gflop": flops / 1e9,
                }
            )
        hook.remove()
    finally:
        algo.stop()
        ray.shutdown()
    update_s = statistics.median(r["update_s"] for r in rows)
    gflop = statistics.median(r["model_gflop"] for r in rows)
    tokens = statistics.median(r["tokens"] for r in rows)
    return {
        "example": name,
        "iterations_counted": len(rows),
        "update_s_median": round(update_s, 2),
        "rollout_s_median": round(statistics.median(r["rollout_s"] for r in rows), 2),
        "transformer_tokens": int(tokens),
        "scored_positions": int(statistics.median(r["scored_positions"] for r in rows)),
        "update_tokens_per_s": round(tokens / update_s, 1),
        "model_gflop_per_update": round(gflop, 1),
        "update_gflops": round(gflop / update_s, 1),
        "share_of_peak": round(gflop / update_s / peak_gflops, 3),
        "torch_threads": torch.get_num_threads(),
    }


def part_forward(args, peak_gflops: float) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from ragen_rllib.warmup.format_warmup import model_path

    _, config = example_config(args)
    path = model_path(config)
    batch, length = config.env_groups * config.group_size, args.prompt_tokens
    ids = torch.randint(100, 1000, (batch, length))
    token = ids[:, :1]
    mask = torch.ones((batch, length + 1), dtype=torch.long)
    position = torch.full((batch, 1), length)
    out = {"batch_rows": batch, "context_tokens": length}
    # The engine's settings (float32, sdpa attention), then two alternatives it could run.
    for dtype, attention in (("float32", "sdpa"), ("float32", "eager"), ("bfloat16", "sdpa")):
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), attn_implementation=attention
        ).eval()
        body, head = transformer_params(model)
        with torch.no_grad():
            prompts = ids[: config.env_groups]
            prefill_s = best_seconds(lambda m=model, p=prompts: m(input_ids=p, logits_to_keep=1), 3)
            past = model(input_ids=ids, use_cache=True, logits_to_keep=1).past_key_values

            def step(m=model, past=past):
                # The cache grows by one position a call; crop it back so every call
                # reads L positions.
                m(
                    input_ids=token,
                    attention_mask=mask,
                    position_ids=position,
                    past_key_values=past,
                    use_cache=True,
                )
                past.crop(-1)

            decode_s = best_seconds(step, 8)
        step_gflop = 2 * (body + head) * batch / 1e9
        out[f"{dtype}/{attention}"] = {
            "decode_step_s": round(decode_s, 4),
            "decode_ceiling_tokens_per_s": round(batch / decode_s, 1),
            "decode_share_of_fp32_peak": round(step_gflop / decode_s / peak_gflops, 3),
            "prefill_tokens_per_s": round(config.env_groups * length / prefill_s, 1),
        }
        del model, past
    return out


def run_json(cmd: list[str], timeout: float) -> dict:
    """Run a bench script and read the JSON object it writes with --json."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "figures.json"
        proc = subprocess.run(
            [*cmd, "--json", str(out)], cwd=ROOT, timeout=timeout, capture_output=True, text=True
        )
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
            return {"error": f"exit {proc.returncode}", "output_tail": tail}
        return json.loads(out.read_text())


def part_rollout(args) -> dict:
    python = args.vllm_python
    if not python or not Path(python).exists():
        return {"skipped": f"no vLLM python ({python!r}); give --vllm-python"}
    _, config = example_config(args)
    cmd = [
        python,
        str(HERE / "bench_vllm.py"),
        "--env",
        config.env,
        "--llm",
        config.llm,
        "--groups",
        str(config.env_groups),
        "--group-size",
        str(config.group_size),
        "--turns",
        str(config.max_turns),
        "--max-new-tokens",
        str(config.max_new_tokens),
        "--threads",
        str(args.threads),
        "--engines",
        "hf,vllm",
    ]
    figures = run_json(cmd, timeout=3600)
    engines = figures.get("engines") or {}
    if "hf" in engines and "vllm" in engines:
        figures["vllm_over_hf_tokens_per_s"] = round(
            engines["vllm"]["generated_tokens_per_s"] / engines["hf"]["generated_tokens_per_s"], 2
        )
    return figures


def part_trl(args) -> dict:
    out = {}
    for groups, size, checkpointing in ((4, 8, False), (8, 16, True)):
        cmd = [
            sys.executable,
            str(HERE / "bench_vs_trl.py"),
            "--llm",
            args.llm,
            "--groups",
            str(groups),
            "--group-size",
            str(size),
            "--max-new-tokens",
            "32",
            "--steps",
            str(args.trl_steps),
            "--blocks",
            "1",
            "--threads",
            str(args.threads),
            *(["--trl-checkpointing"] if checkpointing else []),
        ]
        out[f"{groups}x{size}"] = run_json(cmd, timeout=7200)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default=str(ROOT / "tuned_examples/bandit_smollm2_cpu.yaml"))
    parser.add_argument("--config", default=None, help="JSON object merged into its config")
    parser.add_argument("--llm", default="smollm2-135m-instruct", help="the TRL part's model")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=4, help="update part (first not counted)")
    parser.add_argument("--prompt-tokens", type=int, default=160, help="forward part's cache L")
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    parser.add_argument("--trl-steps", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    parts = args.parts.split(",")
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; known: {', '.join(PARTS)}")

    import torch

    torch.set_num_threads(args.threads)
    figures: dict = {"threads": args.threads, "cpus": os.cpu_count()}

    def show(part: str, value: dict) -> None:
        figures[part] = value
        print(f"{part}: {json.dumps(value)}", flush=True)

    peak = None
    if {"peak", "update", "forward"} & set(parts):
        from transformers import AutoConfig

        from ragen_rllib.models.resolve import resolve_model

        cfg = AutoConfig.from_pretrained(resolve_model(args.llm))
        h, i = cfg.hidden_size, cfg.intermediate_size
        shapes = [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)]
        shapes += [(2048, h, h), (2048, h, i), (2048, i, h), (2048, h, cfg.vocab_size)]
        rates = matmul_peak(shapes)
        peak = max(rates.values())
        show("peak", {"gflops_by_shape": rates, "peak_gflops": peak})
    if "update" in parts:
        show("update", part_update(args, peak))
    if "forward" in parts:
        show("forward", part_forward(args, peak))
    if "rollout" in parts:
        show("rollout", part_rollout(args))
    if "trl" in parts:
        show("trl", part_trl(args))
    print(json.dumps(figures, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
