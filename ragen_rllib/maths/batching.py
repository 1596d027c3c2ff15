"""How a batch of trajectories is cut for the learners: shards, minibatches, micro-batches.

Pure functions (torch and NumPy, no Ray), used by the driver (which trajectories
go to which learner, and how many minibatches an epoch has), by the learner
connector (a trajectory's response stream and the rows it lies in) and by the
learner (each shard's minibatches, and how a minibatch is split into
micro-batches that fit in memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch


def shard_trajectories(tokens: list[int], num_shards: int) -> list[list[int]]:
    """Split trajectories (by index) between ``num_shards`` learners: whole
    trajectories, each learner within one of the others in count, and the token
    totals balanced (longest first, each to the learner with the fewest tokens
    among those not yet full)."""
    if num_shards < 1:
        raise ValueError(f"num_shards must be >= 1, got {num_shards}")
    cap = math.ceil(len(tokens) / num_shards) if tokens else 0
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    load = [0] * num_shards
    for i in sorted(range(len(tokens)), key=lambda i: (-tokens[i], i)):
        open_ = [w for w in range(num_shards) if len(shards[w]) < cap]
        w = min(open_, key=lambda w: (load[w], w))
        shards[w].append(i)
        load[w] += tokens[i]
    return [sorted(s) for s in shards]


def num_minibatches(shard_sizes: list[int], minibatch_size: int | None) -> int:
    """Minibatches (optimizer steps) per epoch for a batch split into shards of these
    sizes: ``ceil(n / minibatch_size)`` of n trajectories (counted in trajectories,
    never in turns or rows). With several learners every minibatch takes
    trajectories from every learner's shard, so that all learners step together,
    which caps the count at the smallest shard's size. At least 1."""
    n = sum(shard_sizes)
    if n == 0:
        return 1
    steps = math.ceil(n / (minibatch_size or n))
    if len(shard_sizes) > 1:
        steps = min([steps, *shard_sizes])
    return max(1, steps)


def minibatch_plan(
    num_trajectories: int, num_minibatches: int, num_epochs: int, shuffle: bool, seed: int
) -> np.ndarray:
    """Which minibatch each of a shard's trajectories is in, per epoch  # -> int [n, epochs].

    Each epoch splits the shard into ``num_minibatches`` parts of sizes as equal as
    possible (so every minibatch of a learner's shard is non-empty when
    ``num_minibatches <= n``); ``shuffle`` permutes the shard first, per epoch, with a
    generator seeded by ``seed``, so a run restored from a checkpoint repeats it."""
    plan = np.zeros((num_trajectories, num_epochs), dtype=np.int64)
    rng = np.random.default_rng(seed)
    for epoch in range(num_epochs):
        order = rng.permutation(num_trajectories) if shuffle else np.arange(num_trajectories)
        for j, part in enumerate(np.array_split(order, num_minibatches)):
            plan[part, epoch] = j
    return plan


#: The learner encodes the prefixes rows share once only when that saves at least
#: this share of a micro-batch's tokens: below it, plain packing's causal attention
#: costs less than the shared layout (the memory planner models the same rule).
MIN_SHARED_SAVING = 0.05
#: With shared prefixes a micro-batch is bounded by the tokens it encodes; its rows
#: times its longest row (what attention gathers keys and values for, a few percent
#: of an encoded token's memory each) stay within this many times that bound.
GATHERED_PER_ENCODED = 8
#: With shared prefixes, attention runs in chunks of each row's own tokens (those it
#: lays down), at least this long and at most this many a row; each chunk gathers the
#: keys and values of its row up to it.
QUERY_CHUNK = 128
MAX_CHUNKS_PER_ROW = 8


@dataclass
class PrefixTree:
    """Rows' tokens as a prefix tree, from :func:`prefix_tree`.

    order: the rows sorted by their tokens; own[r]: how many of row r's first
    tokens it shares with the row before it in that order (the tokens it does not
    lay down); index: [R, L] the packed position of each row token (N: padding);
    encoded: N, the tokens laid down."""

    order: list[int]
    own: list[int]
    lengths: list[int]
    index: np.ndarray
    encoded: int


def prefix_tree(ids: np.ndarray, lengths: np.ndarray) -> PrefixTree:
    """The packed layout of right-padded rows ``ids  # [R, T]`` of ``lengths  # [R]``
    with each distinct prefix once.

    Sorted lexicographically, a row's longest common prefix with any row before it
    is its common prefix with the row just before it, so one pass over the sorted
    rows finds every shared token."""
    lengths = [int(x) for x in lengths]
    width = max(lengths) if lengths else 0
    rows = np.where(np.arange(ids.shape[1])[None, :] < np.asarray(lengths)[:, None], ids, -1)
    rows = rows[:, :width]
    # Padding (-1) sorts first, so a row that is a prefix of another sorts before it.
    order = np.lexsort(rows.T[::-1]).tolist() if len(lengths) else []
    index = np.full((len(lengths), width), 0, dtype=np.int64)
    own = [0] * len(lengths)
    n, prev = 0, None
    for r in order:
        length = lengths[r]
        s = 0
        if prev is not None:
            limit = min(length, lengths[prev])
            differ = np.flatnonzero(rows[r, :limit] != rows[prev, :limit])
            s = int(differ[0]) if differ.size else limit
            index[r, :s] = index[prev, :s]
        index[r, s:length] = np.arange(n, n + length - s)
        n += length - s
        own[r], prev = s, r
    for r, length in enumerate(lengths):
        index[r, length:] = n  # padding reads the zero row after the packed tokens
    return PrefixTree(order=order, own=own, lengths=lengths, index=index, encoded=n)


def shared_microbatch_rows(
    ids: np.ndarray, lengths: list[int], max_tokens: int | None
) -> list[list[int]]:
    """Micro-batches of rows that share prefixes  # -> row indices.

    Rows go in prefix order (:func:`prefix_tree`), so that rows with a common
    beginning land in one micro-batch, and a micro-batch takes rows while the
    tokens its packing encodes (its first row whole, each later row after its
    common prefix with the row before) stay within ``max_tokens`` and its rows
    times its longest row within :data:`GATHERED_PER_ENCODED` times that; a row
    longer than ``max_tokens`` goes alone. ``max_tokens=None``: one micro-batch
    holding every row, in order."""
    if max_tokens is None:
        return [list(range(len(lengths)))] if lengths else []
    tree = prefix_tree(ids, np.asarray(lengths))
    out: list[list[int]] = []
    encoded = longest = 0
    for r in tree.order:
        length = lengths[r]
        cost = length - tree.own[r]
        rows = len(out[-1]) + 1 if out else 0
        wide = max(longest, length)
        fits = encoded + cost <= max_tokens and rows * wide <= GATHERED_PER_ENCODED * max_tokens
        if out and fits:
            out[-1].append(r)
            encoded, longest = encoded + cost, wide
        else:
            out.append([r])
            encoded, longest = length, length
    return out


def microbatches(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, max_tokens: int | None, shared: bool
) -> list[list[int]]:
    """The micro-batch plan of a right-padded [R, T] batch  # -> row indices: bounded by
    the tokens each pass encodes when the model encodes shared prefixes once
    (``shared``, :func:`shared_microbatch_rows`), else by its padded tokens
    (:func:`microbatch_rows`)."""
    lengths = attention_mask.sum(1).tolist()
    if shared:
        return shared_microbatch_rows(input_ids.cpu().numpy(), lengths, max_tokens)
    return microbatch_rows(lengths, max_tokens)


def microbatch_rows(lengths: list[int], max_tokens: int | None) -> list[list[int]]:
    """Split rows of the given token lengths into micro-batches  # -> row indices.

    Rows are sorted by length (longest first) and packed greedily while a
    micro-batch's padded size, rows x its longest row, stays within
    ``max_tokens``; a row longer than that goes alone. Sorting also makes the
    rows of a micro-batch similar in length, so little of it is padding.
    ``max_tokens=None``: one micro-batch holding every row, in order.
    """
    if max_tokens is None:
        return [list(range(len(lengths)))] if lengths else []
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    out: list[list[int]] = []
    for i in order:
        if out and (len(out[-1]) + 1) * lengths[out[-1][0]] <= max_tokens:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def fill_plan(plan: list[list[int]], count: int) -> list[list[int]]:
    """A micro-batch plan stretched to exactly ``count`` micro-batches  # -> row lists.

    Sharded learners (FSDP) gather every layer's parameters in every forward pass,
    a collective call, so all of them must run the same number of micro-batches.
    The micro-batch with the most rows is halved until the plan has ``count``
    entries; when every entry is a single row, empty entries (``[]``, a pass that
    contributes nothing) make up the rest. A plan that is already that long or
    longer is returned as it is."""
    out = [list(rows) for rows in plan]
    while len(out) < count:
        j = max(range(len(out)), key=lambda k: len(out[k]), default=None)
        if j is None or len(out[j]) < 2:
            out.extend([] for _ in range(count - len(out)))
            break
        half = len(out[j]) // 2
        out[j : j + 1] = [out[j][:half], out[j][half:]]
    return out


def take_rows(batch: dict[str, torch.Tensor], rows: list[int]) -> dict[str, torch.Tensor]:
    """The given rows of a [R, ...] batch, with the token axis cut to their longest
    row (rows are right-padded)."""
    index = torch.as_tensor(rows, dtype=torch.long, device=batch["input_ids"].device)
    width = batch["input_ids"].shape[1]
    keep = int(batch["attention_mask"][index].sum(1).max()) if rows else 0
    out = {}
    for key, value in batch.items():
        value = value[index]
        if value.dim() >= 2 and value.shape[1] == width:
            value = value[:, :keep]
        out[key] = value
    return out


def to_stream(x: torch.Tensor, stream_index: torch.Tensor) -> torch.Tensor:
    """Row tokens  # [R, T] -> each trajectory's response stream  # [B, L] (0 as padding).

    ``stream_index``  # [B, L]: the flat [R * T] position of each of a trajectory's
    generated tokens, in order (-1 as padding)."""
    flat = x.reshape(-1)
    return torch.where(stream_index >= 0, flat[stream_index.clamp_min(0)], flat.new_zeros(()))


def from_stream(x: torch.Tensor, stream_index: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Response streams  # [B, L] -> row tokens of ``shape``  # [R, T] (0 off the streams)."""
    out = x.new_zeros(shape.numel() + 1)  # the spare last slot takes the padding
    spare = torch.full_like(stream_index, shape.numel())
    out[torch.where(stream_index >= 0, stream_index, spare).reshape(-1)] = x.reshape(-1)
    return out[:-1].reshape(shape)
