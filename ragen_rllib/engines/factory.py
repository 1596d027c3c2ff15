"""The engine a config names: which class, on which device, how it sleeps.

The env runner calls :func:`make_engine` once; its arguments come from the
config (dtype, context limit, sampling settings) and from the placement plan
(whether the engine shares its process and device with the learner, so
releases memory for every update, and how much of a GPU vLLM may take).
"""

from __future__ import annotations

from ragen_rllib.engines.base import RolloutEngine


def rollout_device(choice: str) -> str:
    """The engine's device: for "auto" the first visible GPU (Ray sets
    CUDA_VISIBLE_DEVICES for the process) when there is one, else the CPU."""
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("config rollout_device='cuda' but this process sees no GPU")
    return choice


def make_engine(config, model_path: str, tokenizer) -> RolloutEngine:
    """The rollout engine that ``config.engine`` names, for the model at ``model_path``."""
    from ragen_rllib.planning.placement import beside_learner, sleep_level_used, vllm_memory_share

    pad = tokenizer.pad_token_id
    device = rollout_device(config.rollout_device)
    level = sleep_level_used(config, beside_learner(config), device == "cuda")
    if config.engine == "vllm":
        from ragen_rllib.engines.vllm_engine import VLLMEngine

        return VLLMEngine(
            model_path,
            eos_token_id=tokenizer.eos_token_id,
            dtype=config.engine_dtype_used,
            max_model_len=config.max_context_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            gpu_memory_utilization=vllm_memory_share(config, model_path),
            kv_cache_gb=config.vllm_kv_cache_gb,
            enforce_eager=config.vllm_enforce_eager,
            max_num_seqs=config.rollout_batch_size,
            seed=config.seed or 0,
            sleep_level=level,
        )
    from ragen_rllib.engines.hf_engine import HFEngine

    return HFEngine(
        model_path,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.eos_token_id if pad is None else pad,
        dtype=config.engine_dtype_used,
        device=device,
        max_batch_size=config.rollout_batch_size,
        sleep_level=level,
    )
