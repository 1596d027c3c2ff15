"""HFEngine: the CPU default rollout engine, on Hugging Face transformers.

A hand-written sampling loop over the KV cache, so the behaviour log-probs come
from the same forward pass that chose the tokens. Given ``cache_keys`` (one per
trajectory), it keeps each trajectory's keys and values between calls, so a
turn encodes only what the previous turn's context did not already hold (prefix
caching). The contract it meets is :mod:`ragen_rllib.engines.base`'s.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from ragen_rllib.console import no_progress_bars
from ragen_rllib.engines.base import GenerateRequest, Generation, RolloutEngine, SamplingParams
from ragen_rllib.models.attention import avoid_per_shape_attention_kernels


@dataclass
class _Prefix:
    """What the engine keeps of one trajectory between turns: the token ids whose keys
    and values it has computed, and those, per layer as (keys, values) of shape
    [kv_heads, len(ids), head_dim]."""

    ids: list[int]
    kv: list[tuple[torch.Tensor, torch.Tensor]]


class _BufferLayer(DynamicLayer):
    """A cache layer that writes keys and values into one buffer allocated for the
    whole answer, instead of concatenating the cache anew at every decode step."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        # Uninitialised: attention reads only the positions written so far.
        self._keys = key_states.new_empty((b, h, self.capacity, d))
        self._values = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"cache of {self.capacity} positions cannot take {end}")
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._keys[:, :, :end], self._values[:, :, :end]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            # Copy the filled positions only; the rest of the buffer is still free.
            keys = self._keys.new_empty((len(indices), *self._keys.shape[1:]))
            values = self._values.new_empty((len(indices), *self._values.shape[1:]))
            keys[:, :, : self.length] = self._keys[indices, :, : self.length]
            values[:, :, : self.length] = self._values[indices, :, : self.length]
            self._keys, self._values = keys, values
            self.keys = self._keys[:, :, : self.length]
            self.values = self._values[:, :, : self.length]


#: Rows whose answers have ended leave the decode batch once they are this share of it.
COMPACT_SHARE = 0.25


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


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
        self._prefixes: dict[Hashable, _Prefix] = {}
        #: prompt tokens taken from the prefix cache instead of encoded, lifetime
        self.prompt_tokens_reused = 0
        self.sleep_level = int(sleep_level)
        self._shapes: dict[str, torch.Size] = {}

    def clear_cache(self) -> None:
        """Forget every trajectory's keys and values (call when its trajectories end)."""
        self._prefixes.clear()

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

    def _past(self, prompts: list[list[int]], keys: list[Hashable] | None, capacity_extra: int):
        """Rows' reusable prefixes as one left-padded cache with room for
        ``capacity_extra`` more positions: (reused lengths, cache, its mask [n, C])."""
        n = len(prompts)
        reuse, entries = [0] * n, [None] * n
        if keys is not None:
            for i, (prompt, key) in enumerate(zip(prompts, keys, strict=True)):
                entry = self._prefixes.get(key)
                if entry is not None:
                    # At least one prompt token is encoded: it gives the next logits.
                    reuse[i] = min(common_prefix_length(entry.ids, prompt), len(prompt) - 1)
                    entries[i] = entry
        width = max(reuse)
        mask = torch.zeros((n, width), dtype=torch.long, device=self.device)
        layers = self.model.config.num_hidden_layers
        cache = Cache(layers=[_BufferLayer(width + capacity_extra) for _ in range(layers)])
        if width == 0:
            return reuse, cache, mask
        some = next(e for e in entries if e is not None)
        for layer in range(layers):
            k0, v0 = some.kv[layer]
            keys_t = k0.new_zeros((n, k0.shape[0], width, k0.shape[2]))
            values_t = v0.new_zeros((n, v0.shape[0], width, v0.shape[2]))
            for i, entry in enumerate(entries):
                if reuse[i]:
                    k, v = entry.kv[layer]
                    keys_t[i, :, width - reuse[i] :] = k[:, : reuse[i]]
                    values_t[i, :, width - reuse[i] :] = v[:, : reuse[i]]
            cache.layers[layer].update(keys_t, values_t)
        for i, r in enumerate(reuse):
            if r:
                mask[i, width - r :] = 1
        return reuse, cache, mask

    def _generate_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        gen: torch.Generator,
        keys: list[Hashable] | None = None,
    ) -> list[Generation]:
        n = len(prompts)
        longest = max(len(p) for p in prompts)
        reuse, past, past_mask = self._past(prompts, keys, longest + params.max_new_tokens)
        suffixes = [p[r:] for p, r in zip(prompts, reuse, strict=True)]
        self.prompt_tokens_reused += sum(reuse)
        width = max(len(s) for s in suffixes)
        # Left padding, so every row's next token sits in the last column. A row's
        # reused prefix sits right-aligned in the past: [pad | prefix | pad | suffix].
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        suffix_mask = torch.zeros((n, width), dtype=torch.long)
        for i, s in enumerate(suffixes):
            input_ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            suffix_mask[i, width - len(s) :] = 1
        input_ids = input_ids.to(self.device)
        attention = torch.cat([past_mask, suffix_mask.to(self.device)], dim=1)
        # Positions count real tokens only, as in the learner's right-padded batch.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)[:, past_mask.shape[1] :]

        # Rows with the same prompt and nothing reused (a group's first turn: N
        # rollouts from one initial state) are encoded once and then copied.
        rows = None
        if max(reuse) == 0:
            first: dict[tuple[int, ...], int] = {}
            owner = [first.setdefault(tuple(s), i) for i, s in enumerate(suffixes)]
            if len(first) < n:
                unique = sorted(first.values())
                slot = {row: j for j, row in enumerate(unique)}
                rows = torch.tensor([slot[o] for o in owner], device=self.device)
                keep = torch.tensor(unique, device=self.device)
                input_ids, attention, positions = (
                    input_ids[keep],
                    attention[keep],
                    positions[keep],
                )
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
        if rows is not None:
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
            if bool(ended.all()):
                break
            if int(ended.sum()) >= COMPACT_SHARE * len(live):
                # Keep the ended rows' keys and values while they are still cached.
                out, going = torch.nonzero(ended).flatten(), torch.nonzero(~ended).flatten()
                if keys is not None:
                    self._keep(prompts, keys, ids, cache, prefill_mask, live, out)
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
            self._keep(prompts, keys, ids, cache, prefill_mask, live, everyone)
        return [
            Generation(ids[i], logps[i], bool(ids[i]) and ids[i][-1] == self.eos_token_id)
            for i in range(n)
        ]

    def _keep(self, prompts, keys, ids, cache, prefill_mask, live, rows) -> None:
        """Store the prompt and answer (all but its last token, which was never fed
        through the model) of the batch rows ``rows``, with their keys and values.
        ``live[j]`` is the prompt that batch row j answers."""
        width = prefill_mask.shape[1]
        for j in rows.tolist():
            i = int(live[j])
            fed = len(ids[i]) - 1  # decode steps that fed this row's sampled tokens
            index = torch.cat(
                [
                    torch.nonzero(prefill_mask[j]).flatten(),
                    torch.arange(width, width + fed, device=self.device),
                ]
            )
            kv = [
                (layer.keys[j].index_select(1, index), layer.values[j].index_select(1, index))
                for layer in cache.layers
            ]
            self._prefixes[keys[i]] = _Prefix(list(prompts[i]) + ids[i][:fed], kv)
