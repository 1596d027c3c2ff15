"""HFEngine: the CPU default rollout engine, on Hugging Face transformers.

A hand-written sampling loop over the KV cache, so the behaviour log-probs come
from the same forward pass that chose the tokens. What a prompt reuses of
earlier keys and values (its trajectory's last turn, the prefix every prompt of
the call begins with) is :mod:`~ragen_rllib.engines.prefix_cache`'s. The
contract it meets is :mod:`ragen_rllib.engines.base`'s.
"""

from __future__ import annotations

from collections.abc import Hashable

import torch

from ragen_rllib.console import no_progress_bars
from ragen_rllib.engines.base import GenerateRequest, Generation, RolloutEngine, SamplingParams
from ragen_rllib.engines.prefix_cache import PrefixCache
from ragen_rllib.models.runtime import avoid_per_shape_attention_kernels, keep_freed_memory

#: Rows whose answers have ended leave the decode batch once they are this share of it.
COMPACT_SHARE = 0.25


def _sample(
    logits: torch.Tensor,
    params: SamplingParams,
    gen: torch.Generator,
    uniforms: torch.Tensor | None = None,
):
    """Pick one token per row of ``logits  # [B, V]``; return (token [B], logp [B]).

    ``uniforms  # [B, 1]`` are the rows' random draws in [0, 1) (default: drawn
    from ``gen``); the engine draws them for every row of its batch, so that a
    row's sample does not depend on which other rows are still decoding."""
    if params.temperature == 0:
        logp_all = torch.log_softmax(logits.float(), dim=-1)
        token = logp_all.argmax(dim=-1)
        return token, logp_all.gather(-1, token[:, None]).squeeze(-1)
    logp_all = torch.log_softmax(logits.float() / params.temperature, dim=-1)  # [B, V]
    probs = logp_all.exp()
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always).
        drop = sorted_p.cumsum(-1) - sorted_p >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    # Inverse CDF: one uniform draw per row (multinomial draws far more randomness
    # and costs several times as much). Zeroed entries can never be chosen.
    cdf = probs.cumsum(-1)
    u = uniforms
    if u is None:
        u = torch.rand((probs.shape[0], 1), generator=gen, device=probs.device)
    u = u.to(cdf.dtype)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).squeeze(-1)
    # The first entry whose cdf exceeds the target always has a positive probability,
    # so only a target rounded up to the total (index V) needs the last positive entry.
    # Checked lazily: over the whole vocabulary each step it costs as much as sampling.
    over = token >= probs.shape[-1]
    if bool(over.any()):
        last = (probs > 0).cumsum(-1).argmax(-1)
        token = torch.where(over, last, token)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1)


class HFEngine(RolloutEngine):
    """Batched sampling with a transformers causal LM.

    Args:
        model_path: a Hugging Face model directory or hub id.
        eos_token_id / pad_token_id: ids that end an answer / fill padding.
        dtype: "float32" or "bfloat16".
        device: torch device string.
        max_batch_size: prompts per forward batch at most (memory bound).
        sleep_level: what :meth:`release` frees (see
            :class:`~ragen_rllib.engines.base.RolloutEngine`): at 1 the weights move
            to host memory (nothing to do on a CPU device), at 2 their storage is
            freed; either way the prefix cache is dropped.

    The engine keeps its own copy of the weights, also when it sits beside the
    learner in one process: the learner's copy is fp32 master weights in training
    mode (gradient checkpointing, packed-row attention), the engine's is the
    rollout dtype in eval mode with its KV buffers; sharing would make every
    decode step cast the weights or run in fp32. Level 2 frees the copy during
    each update instead.
    """

    def __init__(
        self,
        model_path: str,
        *,
        eos_token_id: int,
        pad_token_id: int,
        dtype: str = "float32",
        device: str = "cpu",
        max_batch_size: int = 256,
        sleep_level: int = 0,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if torch.device(device).type == "cuda":
            avoid_per_shape_attention_kernels()
        else:
            keep_freed_memory()
        with no_progress_bars():
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model = model.to(device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.policy_version = 0
        self.cache = PrefixCache(self.model, self.device)
        #: prompt tokens taken from the prefix cache instead of encoded, lifetime
        self.prompt_tokens_reused = 0
        self.sleep_level = int(sleep_level)
        self._shapes: dict[str, torch.Size] = {}

    def clear_cache(self) -> None:
        """Forget every trajectory's keys and values (call when its trajectories end)
        and the common prefixes of their prompts."""
        self.cache.clear()

    def _sleep(self, level: int) -> str:
        params = dict(self.model.named_parameters())  # a tied head is listed once
        if level == 1:
            if self.device.type == "cpu":
                return "skipped: the weights are in host memory already"
            for p in params.values():
                p.data = p.data.to("cpu")
        else:
            self._shapes = {name: p.shape for name, p in params.items()}
            for p in params.values():  # the Parameter objects (and a tied head) stay
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return "slept"

    def _wake(self) -> None:
        for name, p in self.model.named_parameters():
            if self.sleep_level == 1:
                p.data = p.data.to(self.device)
            else:  # room for the weights the caller loads next
                p.data = torch.empty(self._shapes[name], dtype=p.dtype, device=self.device)

    def _load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        # Tied embeddings may be absent from the state dict; anything else is a mismatch.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"weights do not match the rollout model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        self.policy_version = int(version)
        self.clear_cache()  # keys and values of the old weights

    @torch.no_grad()
    def _generate(self, request: GenerateRequest) -> list[Generation]:
        """With cache keys, the keys and values of each prompt's longest prefix that
        this engine computed before under the same key are reused, and each prompt
        plus its answer is kept for the next call."""
        prompts, cache_keys = request.prompts, request.cache_keys
        gen = torch.Generator(device=self.device).manual_seed(request.seed)
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            stop = start + self.max_batch_size
            keys = None if cache_keys is None else cache_keys[start:stop]
            out.extend(self._generate_batch(prompts[start:stop], request.params, gen, keys))
        return out

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        gen: torch.Generator,
        keys: list[Hashable] | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        longest = max(len(p) for p in prompts)
        reuse, entries = self.cache.reused(prompts, keys)
        self.prompt_tokens_reused += sum(reuse)
        # Rows that reuse the same keys and values and continue them with the same ids
        # (a group's first turn: N rollouts from one initial state) are encoded once
        # and then copied.
        first: dict[tuple, int] = {}
        owner = [
            first.setdefault((id(entries[i]), reuse[i], tuple(p[reuse[i] :])), i)
            for i, p in enumerate(prompts)
        ]
        unique = sorted(first.values())
        slot = {row: j for j, row in enumerate(unique)}
        rows = torch.tensor([slot[o] for o in owner], device=self.device)
        u_reuse = [reuse[i] for i in unique]
        past, past_mask = self.cache.past(
            u_reuse, [entries[i] for i in unique], longest + params.max_new_tokens
        )
        suffixes = [prompts[i][reuse[i] :] for i in unique]
        width = max(len(x) for x in suffixes)
        # Left padding, so every row's next token sits in the last column. A row's
        # reused prefix sits right-aligned in the past: [pad | prefix | pad | suffix].
        input_ids = torch.full((len(unique), width), self.pad_token_id, dtype=torch.long)
        suffix_mask = torch.zeros((len(unique), width), dtype=torch.long)
        for i, x in enumerate(suffixes):
            input_ids[i, width - len(x) :] = torch.tensor(x, dtype=torch.long)
            suffix_mask[i, width - len(x) :] = 1
        input_ids = input_ids.to(self.device)
        attention = torch.cat([past_mask, suffix_mask.to(self.device)], dim=1)
        # Positions count real tokens only, as in the learner's right-padded batch.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, past_mask.shape[1] :]
        # Only the last position's logits are needed: the LM head over the whole
        # prompt would be most of the prefill's work for a small model.
        result = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            past_key_values=past,
            use_cache=True,
            logits_to_keep=1,
        )
        cache, logits = result.past_key_values, result.logits[:, -1]
        if len(unique) < n:
            cache.batch_select_indices(rows)
            logits, attention, positions = logits[rows], attention[rows], positions[rows]
        prefill_mask = attention  # the decode loop below grows `attention`
        next_pos = positions[:, -1:] + 1
        ids = [[] for _ in range(n)]
        logps = [[] for _ in range(n)]
        # The batch shrinks as answers end: `live` maps its rows to the prompts'. An
        # ended row is fed padding until COMPACT_SHARE of the batch has ended, and
        # then they all leave it at once (each removal copies the whole cache).
        live = torch.arange(n, device=self.device)
        ended = torch.zeros(n, dtype=torch.bool, device=self.device)
        for _ in range(params.max_new_tokens):
            uniforms = None
            if params.temperature > 0:  # one draw per prompt, used or not
                uniforms = torch.rand((n, 1), generator=gen, device=self.device)
                uniforms = uniforms if len(live) == n else uniforms[live]
            token, logp = _sample(logits, params, gen, uniforms)
            token = torch.where(ended, torch.full_like(token, self.pad_token_id), token)
            # One device-to-host copy per step, not one per row.
            token_list, logp_list, live_list = token.tolist(), logp.tolist(), live.tolist()
            for j in torch.nonzero(~ended).flatten().tolist():
                ids[live_list[j]].append(token_list[j])
                logps[live_list[j]].append(logp_list[j])
            ended |= token == self.eos_token_id
            if params.stop is not None:  # a stop sequence's last token ends its answer
                hit = [
                    j
                    for j in torch.nonzero(~ended).flatten().tolist()
                    if params.stop.reached(ids[live_list[j]])
                ]
                if hit:
                    ended[hit] = True
            if bool(ended.all()):
                break
            if int(ended.sum()) >= COMPACT_SHARE * len(live):
                # Keep the ended rows' keys and values while they are still cached.
                out, going = torch.nonzero(ended).flatten(), torch.nonzero(~ended).flatten()
                if keys is not None:
                    self.cache.keep(prompts, keys, ids, cache, prefill_mask, live, out)
                cache.batch_select_indices(going)
                live, token, attention = live[going], token[going], attention[going]
                next_pos, prefill_mask, ended = next_pos[going], prefill_mask[going], ended[going]
            attention = torch.cat(
                [attention, torch.ones((len(live), 1), dtype=attention.dtype, device=self.device)],
                1,
            )
            result = self.model(
                input_ids=token[:, None],
                attention_mask=attention,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = result.past_key_values, result.logits[:, -1]
            next_pos = next_pos + 1
        if keys is not None:
            everyone = torch.arange(len(live), device=self.device)
            self.cache.keep(prompts, keys, ids, cache, prefill_mask, live, everyone)
        return [
            Generation(ids[i], logps[i], bool(ids[i]) and ids[i][-1] == self.eos_token_id)
            for i in range(n)
        ]
