"""Is decoding launch-bound? One decode step of a model shape, three ways, per batch size.

For each batch size the script prefills random prompts and then times greedy
decode steps (the median of ``--steps``, after two warm-up steps):

- ``dynamic``: the key-value cache grows by one token a step (what the HF
  engine's loop does, without its sampling and stop checks);
- ``static``: the cache is allocated once at its full length and written in
  place (transformers' ``StaticCache``), still one Python call per step;
- ``graph`` (GPU only): the static step captured once as a CUDA graph and
  replayed, so a step is one launch instead of one per kernel.

It also profiles one dynamic step (the CUDA events it records, kernels with
copies and fills, and their summed device time; compare that with the
unprofiled ``dynamic_ms``, since the profiler slows the step it watches: a step
whose kernels keep the GPU busy a small share of its time is bound by the host's
work of launching them), and checks that the graph replays the static path: the
share of rows with the same greedy tokens, and the largest difference of the
logits of the last step.

Exits 3 when a probe broke (a row with ``profile_error`` or ``graph_error``);
each row is written to ``--json`` as soon as it is measured.

    python bench/probe_decode_launch.py --shape smollm2 --batch 16 64 128 256
    python bench/probe_decode_launch.py --device cpu --shape tiny --batch 2 --steps 4  # CPU

Random weights: the figures are speed, not text. One JSON line per (shape,
batch) on stdout, and in ``--json`` when given.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from ragen_rllib.planning.shapes import KNOWN_CONFIGS

#: Model shapes (random weights): SmolLM2-135M (the real model of the CPU
#: examples), the Qwen2.5-0.5B shape of the GPU figures, and a tiny one for CPU.
SHAPES = {
    "smollm2": dict(
        model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, vocab_size=49152,
        tie_word_embeddings=True, rope_theta=100000.0,
    ),
    "qwen05b": KNOWN_CONFIGS["qwen/qwen2.5-0.5b"],  # the planner's shape of it
    "tiny": dict(
        model_type="llama", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True,
    ),
}  # fmt: skip


def build(shape: str, device: str, dtype):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(SHAPES[shape])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.to(device).eval(), config


def sync(torch, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_steps(torch, device, step, first, steps: int):
    """Greedy decode ``steps`` tokens with ``step(tokens, position) -> logits``; returns the
    tokens, the last logits and the median step seconds (after two warm-up steps)."""
    tokens, times, out, logits = first, [], [], None
    for i in range(steps + 2):
        sync(torch, device)
        start = time.perf_counter()
        logits = step(tokens, i)
        tokens = logits[:, -1:].argmax(-1)
        sync(torch, device)
        if i >= 2:
            times.append(time.perf_counter() - start)
        out.append(tokens)
    return torch.cat(out, 1), logits, statistics.median(times)


def probe(shape: str, batch: int, args) -> dict:
    import torch
    from transformers import DynamicCache, StaticCache

    device = args.device
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model, config = build(shape, device, dtype)
    gen = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, config.vocab_size, (batch, args.prompt), generator=gen).to(device)
    total = args.prompt + args.steps + 2
    row: dict = {"shape": shape, "batch": batch, "prompt": args.prompt, "device": device}

    with torch.inference_mode():
        # dynamic: the cache grows each step
        cache = DynamicCache()
        first = model(prompt, past_key_values=cache).logits[:, -1:].argmax(-1)
        dynamic_tokens, _, row["dynamic_ms"] = time_steps(
            torch, device, lambda t, i: model(t, past_key_values=cache).logits, first, args.steps
        )
        if device == "cuda":
            row.update(profile_step(torch, model, first, cache))

        # static: the cache allocated once, written in place
        def static_cache():
            cache = StaticCache(config=config, max_cache_len=total)
            pos = torch.arange(args.prompt, device=device)
            logits = model(prompt, past_key_values=cache, cache_position=pos).logits
            return cache, logits[:, -1:].argmax(-1)

        cache, first = static_cache()

        def static_step(t, i):
            pos = torch.tensor([args.prompt + i], device=device)
            return model(t, past_key_values=cache, cache_position=pos).logits

        static_tokens, static_logits, row["static_ms"] = time_steps(
            torch, device, static_step, first, args.steps
        )
        # The static path decodes what the dynamic one does (rows that differ: a
        # near-tie broken the other way in low precision, or a wrong mask).
        same = (static_tokens == dynamic_tokens).all(dim=1)
        row["static_rows_equal_dynamic"] = round(same.float().mean().item(), 3)

    if device == "cuda":
        row.update(graph_probe(torch, model, static_cache, args, static_tokens, static_logits))
    for key in ("dynamic_ms", "static_ms", "graph_ms"):
        if key in row:
            row[key] = round(row[key] * 1e3, 3)
            row[key.replace("_ms", "_tokens_per_s")] = round(batch / row[key] * 1e3)
    return row


def profile_step(torch, model, token, cache) -> dict:
    """One dynamic decode step under the profiler: its CUDA kernels, their summed
    device time and the step's wall time."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            torch.cuda.synchronize()
            start = time.perf_counter()
            model(token, past_key_values=cache)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy = sum(e.device_time for e in kernels) / 1e3  # us -> ms
        return {
            "kernels_per_step": len(kernels),
            "kernel_ms_per_step": round(busy, 3),
            "profiled_step_ms": round(wall * 1e3, 3),
        }
    except Exception as exc:  # noqa: BLE001 - a finding to report, whatever broke
        return {"profile_error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def graph_probe(torch, model, static_cache, args, want_tokens, want_logits) -> dict:
    """The static step captured as a CUDA graph and replayed, from a fresh prefill;
    the same steps as the static path, so its tokens must match."""
    try:
        with torch.inference_mode():
            cache, first = static_cache()
            token = first.clone()
            position = torch.tensor([args.prompt], device="cuda")
            # Two eager steps on a side stream before the capture (allocations, workspaces);
            # they write the slots the replays overwrite next.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model(token, past_key_values=cache, cache_position=position)
            torch.cuda.current_stream().wait_stream(side)
            # transformers' static layers write where their own length counter points
            # (a tensor, advanced in place by every step, replays included), not at
            # cache_position: set it back to the first decode slot.
            for layer in cache.layers:
                layer.cumulative_length.fill_(args.prompt)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = model(token, past_key_values=cache, cache_position=position).logits

            def step(t, i):
                token.copy_(t)
                position.fill_(args.prompt + i)
                graph.replay()
                return logits

            tokens, last, seconds = time_steps(torch, "cuda", step, first, args.steps)
        diff = (last.float() - want_logits.float()).abs().max().item()
        same = (tokens == want_tokens).all(dim=1)
        return {
            "graph_ms": seconds,
            "graph_rows_equal_static": round(same.float().mean().item(), 3),
            "graph_last_logits_max_abs_diff": round(diff, 5),
        }
    except Exception as exc:  # noqa: BLE001 - a finding to report, whatever broke
        return {"graph_error": f"{type(exc).__name__}: {str(exc)[:300]}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", nargs="+", default=["smollm2"], choices=sorted(SHAPES))
    parser.add_argument("--batch", nargs="+", type=int, default=[16, 64, 128, 256])
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens per row")
    parser.add_argument("--steps", type=int, default=24, help="timed decode steps")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--json", default=None, help="also write the rows (JSON lines) here")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("probe_decode_launch: no GPU visible; --device cpu", file=sys.stderr)
            return 2
        from ragen_rllib.models.runtime import avoid_per_shape_attention_kernels

        avoid_per_shape_attention_kernels()  # as the engine does on a GPU
    broke = False
    out = open(args.json, "w") if args.json else None  # noqa: SIM115 - closed below
    try:
        for shape in args.shape:
            for batch in args.batch:
                row = probe(shape, batch, args)
                line = json.dumps(row)
                print(line, flush=True)
                if out is not None:
                    out.write(line + "\n")
                    out.flush()
                broke = broke or any(key.endswith("_error") for key in row)
                if args.device == "cuda":
                    torch.cuda.empty_cache()  # the last batch's model and caches
    finally:
        if out is not None:
            out.close()
    return 3 if broke else 0


if __name__ == "__main__":
    sys.exit(main())
