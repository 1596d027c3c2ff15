"""The HF engine's keys and values kept between calls: each trajectory's, and the prefix
every prompt of a call begins with.

:class:`PrefixCache` tells the engine, for each prompt of a call, how many of its
first tokens need no encoding and where their keys and values are:

- a trajectory's entry (its cache key's): the last turn's prompt and answer, so a
  turn encodes only what its context adds;
- the common prefix: the tokens every prompt of the call begins with (the chat
  template's system message and the env's instructions), encoded once for the
  call and kept, so the next call (the next turn, whose prompts begin the same
  way) encodes only what its own common prefix adds.

Everything is dropped by :meth:`PrefixCache.clear` (the runner's batch ends, or
new weights arrive).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

#: The tokens every prompt of a call begins with are encoded once for all of them
#: when there are at least this many; the engine keeps the last few such prefixes.
MIN_COMMON_PREFIX = 8
MAX_COMMON_PREFIXES = 8


@dataclass
class _Prefix:
    """Keys and values kept between calls (a trajectory's, or a common prefix): the
    token ids they were computed for, and per layer (keys, values) of shape
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


def common_prefix_length(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class PrefixCache:
    """The keys and values an :class:`~ragen_rllib.engines.hf_engine.HFEngine` keeps
    between calls, for ``model`` on ``device``."""

    def __init__(self, model, device: torch.device):
        self.model, self.device = model, device
        self.prefixes: dict[Hashable, _Prefix] = {}
        #: prefixes every prompt of a call began with, by their ids (see common_prefix)
        self.common: dict[tuple[int, ...], _Prefix] = {}

    def clear(self) -> None:
        """Forget every trajectory's keys and values and every common prefix."""
        self.prefixes.clear()
        self.common.clear()

    def reused(
        self, prompts: list[list[int]], keys: list[Hashable] | None
    ) -> tuple[list[int], list[_Prefix | None]]:
        """For each prompt, how many of its first tokens' keys and values are cached
        and where: its trajectory's entry (its cache key's), or the prefix every
        prompt of the call begins with (:meth:`common_prefix`), whichever holds more.
        At least one prompt token is always left to encode: it gives the next logits."""
        n = len(prompts)
        reuse, entries = [0] * n, [None] * n
        if keys is not None:
            for i, (prompt, key) in enumerate(zip(prompts, keys, strict=True)):
                entry = self.prefixes.get(key)
                if entry is not None:
                    reuse[i] = min(common_prefix_length(entry.ids, prompt), len(prompt) - 1)
                    entries[i] = entry
        common = self.common_prefix(prompts, reuse)
        if common is not None:
            for i, prompt in enumerate(prompts):
                length = min(len(common.ids), len(prompt) - 1)
                if length > reuse[i]:
                    reuse[i], entries[i] = length, common
        return reuse, entries

    def common_prefix(self, prompts: list[list[int]], reuse: list[int]) -> _Prefix | None:
        """The keys and values of the tokens every prompt of a call begins with (the
        system message and the task's instructions, say), computed once and kept until
        :meth:`clear`; None when they are fewer than :data:`MIN_COMMON_PREFIX`
        or every prompt already reuses at least as much from its trajectory's entry.
        Only the tokens past the longest start it shares with a kept one are encoded."""
        if len(prompts) < 2 and not self.common:
            return None
        length = len(prompts[0])
        for prompt in prompts[1:]:
            length = common_prefix_length(prompts[0][:length], prompt)
        ids = tuple(prompts[0][:length])
        if length < MIN_COMMON_PREFIX:
            return None
        if all(r >= min(length, len(p) - 1) for r, p in zip(reuse, prompts, strict=True)):
            return None
        if ids in self.common:
            return self.common[ids]
        # Start from the kept prefix that shares the most tokens with this one.
        done, base = 0, None
        for entry in self.common.values():
            shared = common_prefix_length(entry.ids, list(ids))
            if shared > done:
                done, base = shared, entry
        layers = self.model.config.num_hidden_layers
        cache = Cache(layers=[_BufferLayer(length) for _ in range(layers)])
        if base is not None:
            for layer, (k, v) in zip(cache.layers, base.kv, strict=True):
                layer.update(k[None, :, :done], v[None, :, :done])
        if done < length:
            self.model(
                input_ids=torch.tensor([ids[done:]], dtype=torch.long, device=self.device),
                position_ids=torch.arange(done, length, device=self.device)[None],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        entry = _Prefix(list(ids), [(layer.keys[0], layer.values[0]) for layer in cache.layers])
        if len(self.common) >= MAX_COMMON_PREFIXES:
            self.common.pop(next(iter(self.common)))  # the oldest
        self.common[ids] = entry
        return entry

    def past(self, reuse: list[int], entries: list[_Prefix | None], capacity_extra: int):
        """Rows' reused prefixes as one left-padded cache with room for
        ``capacity_extra`` more positions: (cache, its mask [n, C])."""
        n = len(reuse)
        width = max(reuse)
        mask = torch.zeros((n, width), dtype=torch.long, device=self.device)
        layers = self.model.config.num_hidden_layers
        cache = Cache(layers=[_BufferLayer(width + capacity_extra) for _ in range(layers)])
        if width == 0:
            return cache, mask
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
        return cache, mask

    def keep(self, prompts, keys, ids, cache, prefill_mask, live, rows) -> None:
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
            self.prefixes[keys[i]] = _Prefix(list(prompts[i]) + ids[i][:fed], kv)
