"""Peak memory of each piece of a run, estimated from the config and the model's shape.

Each estimate is a list of :class:`Line` (a component, its bytes, how it was
counted), so a user sees what takes the memory and which knob moves it. The
model of each component:

- **Learner state**: fp32 master weights, fp32 gradients and AdamW's two fp32
  moments for every trainable parameter (16 bytes each); LoRA trains adapters
  only and keeps the frozen base in ``model_dtype``; FSDP divides all of it by
  the number of learners and adds the buffers of two gathered layers.
- **Activations** of one micro-batch of T tokens, per layer, in the compute
  dtype: what a decoder layer keeps for its backward pass (per token about 6
  hidden, 6 query, 6 KV and 4 MLP widths).
  With gradient checkpointing only each layer's input is kept, and one layer is
  recomputed at a time.
- **LM head**: the learner scores response positions only, in chunks of at most
  1,024 tokens; one chunk's logits, their fp32 copy, log-softmax, softmax and
  gradient are alive at once.
- **Critic**: a second transformer (no LM head) with its own state and
  activations (with checkpointing, its layer inputs: the recomputed layer is
  one layer of either model at a time). **KL reference**: a frozen copy in
  ``model_dtype`` (none with LoRA, where the reference is the adapter switched off).
- **Engine**: its weights in ``model_dtype`` and the KV cache of its share of the
  P x N trajectories at the context limit (vLLM: the configured KV size or the
  share of the card it is given).
- **Runtime**: what a process holds before any model (CUDA context and allocator
  slack on a GPU; Python, torch and Ray on a CPU).

Validated against measured peaks (the planner's figures sit beside them in
``docs/planning.md`` and ``bench/bench_plan.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ragen_rllib.maths.batching import GATHERED_PER_ENCODED, MIN_SHARED_SAVING, QUERY_CHUNK
from ragen_rllib.planning.shapes import ModelShape

GIB = 1 << 30
#: What a GPU process holds before any tensor: CUDA context, cuBLAS workspaces and
#: the caching allocator's slack.
GPU_RUNTIME_BYTES = int(1.0 * GIB)
#: A CPU process of this project after importing torch, transformers and Ray.
CPU_RUNTIME_BYTES = int(0.5 * GIB)
#: Ray's own processes on the head node: raylet, GCS, dashboard, log monitor,
#: autoscaler monitor, dashboard and runtime-env agents, and two idle workers
#: (measured with `ps` beside a run on a 2-CPU machine: 0.50 GB + 2 x 0.08 GB).
RAY_HEAD_BYTES = int(0.62 * GIB)
#: The learner scores this many response positions at a time through the LM head.
LM_HEAD_CHUNK = 1024
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class Line:
    component: str
    bytes: int
    note: str = ""
    #: The bytes with gradient checkpointing the other way (activations only).
    other_checkpointing: int | None = None


def fmt_bytes(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Workload:
    """The sizes of one iteration that memory depends on, from the config."""

    trajectory_tokens: int  # one training sequence at most (the context limit by default)
    response_tokens: int  # generated tokens of that sequence at most
    rows_per_microbatch: int  # training sequences in one forward/backward pass
    sequences: int  # P x N trajectories sampled per iteration
    #: Prompts the actor encodes once for all the rows of a micro-batch that share
    #: them (single-turn groups: the sharing every batch has); 0: none counted.
    shared_prompts: int = 0
    evaluation_rows: int = 0  # rows the engine holds at once while evaluating
    #: With shared prefixes: the tokens one pass encodes at most
    #: (max_tokens_per_microbatch); None: rows are bounded by their padded size.
    encoded_bound: int | None = None

    @property
    def full_tokens(self) -> int:
        """Tokens of one micro-batch with every row encoded in full."""
        return self.rows_per_microbatch * self.trajectory_tokens

    @property
    def microbatch_tokens(self) -> int:
        """Tokens the transformer runs in one micro-batch, at most."""
        tokens = self.full_tokens
        if self.shared_prompts:
            prompt = self.trajectory_tokens - self.response_tokens
            tokens = self.shared_prompts * prompt + self.rows_per_microbatch * self.response_tokens
        return min(tokens, self.encoded_bound or tokens)

    @property
    def gathered_positions(self) -> int:
        """Key positions the attention gathers in one pass with shared prefixes (each
        query chunk reads its row up to it), at most; 0 without sharing."""
        if self.encoded_bound is None:
            return 0
        chunks = -(-self.microbatch_tokens // QUERY_CHUNK) + self.rows_per_microbatch
        return chunks * self.trajectory_tokens


def workload(
    config,
    num_learners: int,
    trajectory_tokens: int | None = None,
    response_tokens: int | None = None,
) -> Workload:
    """Worst case by default: every training sequence at the context limit, with as
    many generated tokens as its turns allow, sharing no more than every batch
    shares."""
    tokens = int(trajectory_tokens or config.max_context_tokens)
    turns = 1 if config.context_window is not None else config.max_turns
    response = min(tokens, response_tokens or turns * config.max_new_tokens)
    per_learner = max(1, -(-config.minibatch_size // num_learners))
    bound = config.max_tokens_per_microbatch
    sharing = bool(config.pack_sequences and config.share_prefixes)
    rows = per_learner
    if bound:
        # Shared prefixes: a pass encodes at most `bound` tokens, and its rows times
        # its longest row stay within GATHERED_PER_ENCODED times that.
        padded = GATHERED_PER_ENCODED * bound if sharing else bound
        rows = max(1, min(per_learner, padded // tokens))
    # The N answers of a group to one prompt: the actor encodes the prompt once per
    # micro-batch (rows sharing prefixes go to the same micro-batch).
    shared = 0
    if sharing and config.max_turns == 1 and config.group_size > 1:
        groups = -(-config.env_groups // num_learners)
        shared = min(rows, groups)
        saved = rows * tokens - (shared * (tokens - response) + rows * response)
        if saved < MIN_SHARED_SAVING * rows * tokens:
            shared = 0
    evaluation = 0
    if config.eval_interval or config.eval_suites:
        samples = max(1, config.eval_samples_per_state)
        evaluation = min(config.eval_num_states * samples, config.rollout_batch_size)
    return Workload(
        tokens,
        response,
        rows,
        config.env_groups * config.group_size,
        shared,
        evaluation,
        encoded_bound=bound if sharing and bound else None,
    )


def tree_tokens(config, common: int, first: int) -> tuple[int, int]:
    """(row tokens, tokens the learner's prefix tree encodes) of one iteration's update,
    at the worst case of every trajectory playing ``max_turns`` turns of
    ``max_new_tokens`` answers, each later turn adding as many tokens of its own as
    the first prompt has after the ``common`` prefix every first prompt begins with
    (``first``: a first prompt's length).

    What the tree shares: the common prefix, once a pass; a group's first prompt,
    once for its N first turns; under a context window that still holds a
    trajectory's whole history, each turn's row after the row of the turn before it
    (a window that has started to slide shares only the common prefix)."""
    turns, answer = config.max_turns, config.max_new_tokens
    groups, size = config.env_groups, config.group_size
    own = first - common  # a turn's text after the common prefix
    window = config.context_window
    if window is None:
        length = first + turns * answer + (turns - 1) * own
        rows = groups * size * length
        encoded = groups * own + groups * size * (length - first)
    else:
        lengths = [first + answer + min(window, t) * (answer + own) for t in range(turns)]
        rows = groups * size * sum(lengths)
        encoded = groups * own + groups * size * answer  # the first turns
        for t in range(1, turns):
            extends = window >= t  # the window still holds every turn before
            new = lengths[t] - lengths[t - 1] if extends else lengths[t] - common
            encoded += groups * size * new
    bound = config.max_tokens_per_microbatch
    passes = max(1, -(-(encoded + common) // bound)) if bound else 1
    return rows, encoded + passes * common


def layer_activation_bytes(shape: ModelShape, tokens: int, dtype_bytes: int) -> int:
    """What one decoder layer keeps for backward for ``tokens`` tokens."""
    h, kv, i, q = shape.hidden, shape.kv_dim, shape.intermediate, shape.heads * shape.head_dim
    # Two RMSNorms (input, squared input, normalised: 3 widths each); queries, keys and
    # values before and after the rotary embedding, the keys and values repeated to
    # the query heads, the attention output; the MLP's gate, its activation, up and
    # their product.
    kept = 6 * h + 6 * q + 6 * kv + 4 * i
    return tokens * kept * dtype_bytes


def gathered_bytes(shape: ModelShape, load: Workload, dtype_bytes: int) -> int:
    """Shared prefixes: the keys and values the attention gathers per query chunk and
    keeps for the backward pass, every layer."""
    return shape.layers * load.gathered_positions * 2 * shape.kv_dim * dtype_bytes


def activation_line(shape: ModelShape, load: Workload, dtype_bytes: int, checkpointing: bool):
    t = load.microbatch_tokens
    full = shape.layers * layer_activation_bytes(shape, t, dtype_bytes)
    # With checkpointing one layer is recomputed at a time, on top of the kept inputs.
    kept_inputs = shape.layers * t * shape.hidden * dtype_bytes
    ckpt = kept_inputs + layer_activation_bytes(shape, t, dtype_bytes)
    gathered = gathered_bytes(shape, load, dtype_bytes)
    used, other = (ckpt, full) if checkpointing else (full, ckpt)
    used, other = used + gathered, other + gathered
    if load.encoded_bound is not None:
        encoded = f"<= {t:,} tokens encoded (shared prefixes once)"
    elif load.shared_prompts:
        encoded = f"{load.shared_prompts} shared prompts encoded once ({t:,} tokens)"
    else:
        encoded = f"{t:,} tokens"
    note = (
        f"{load.rows_per_microbatch} x {load.trajectory_tokens} tokens, {encoded}; "
        f"checkpointing {'on' if checkpointing else 'off'} ({fmt_bytes(other)} with it "
        f"{'off' if checkpointing else 'on'})"
    )
    return Line("activations (one micro-batch)", used, note, other_checkpointing=other)


def lm_head_line(shape: ModelShape, load: Workload, dtype_bytes: int) -> Line:
    chunk = min(LM_HEAD_CHUNK, load.rows_per_microbatch * load.response_tokens)
    used = chunk * shape.vocab * (dtype_bytes + 12)
    return Line("LM head (one chunk)", used, f"{chunk} positions x vocabulary {shape.vocab:,}")


def learner_lines(config, shape: ModelShape, num_learners: int, load: Workload) -> list[Line]:
    """One learner's memory during its update."""
    fsdp = config.learner_strategy == "fsdp" and num_learners > 1
    shard = num_learners if fsdp else 1
    model_bytes = DTYPE_BYTES[config.model_dtype_used]
    params = shape.params()
    how = f" / {shard} (FSDP)" if fsdp else ""
    lines = []
    if config.lora_rank:
        trainable = shape.lora_params(config.lora_rank)
        lines.append(
            Line(
                "weights (frozen base)",
                params * model_bytes // shard,
                f"{params / 1e6:,.0f}M x {model_bytes} B{how}",
            )
        )
        lines.append(Line("weights (LoRA adapters, fp32)", trainable * 4 // shard, ""))
    else:
        trainable = params
        lines.append(
            Line("weights (fp32 master)", params * 4 // shard, f"{params / 1e6:,.0f}M x 4 B{how}")
        )
    lines.append(
        Line("gradients (fp32)", trainable * 4 // shard, f"{trainable / 1e6:,.1f}M x 4 B{how}")
    )
    lines.append(
        Line("AdamW moments (fp32)", trainable * 8 // shard, f"{trainable / 1e6:,.1f}M x 8 B{how}")
    )
    if fsdp:
        gathered = 2 * shape.layer_params() * model_bytes
        lines.append(Line("FSDP gathered layers", gathered, "two layers unsharded at a time"))
    compute_bytes = model_bytes
    checkpointing = bool(config.gradient_checkpointing)
    act = activation_line(shape, load, compute_bytes, checkpointing)
    lines.append(act)
    lines.append(lm_head_line(shape, load, compute_bytes))
    if config.uses_critic:
        backbone = shape.backbone_params()
        critic_trainable = shape.lora_params(config.lora_rank) if config.lora_rank else backbone
        state = critic_trainable * 12 + (backbone * model_bytes if config.lora_rank else 0)
        lines.append(
            Line(
                "critic (weights, AdamW)",
                state // shard,
                f"a second transformer, {backbone / 1e6:,.0f}M parameters",
            )
        )
        lines.append(Line("critic gradients (fp32)", critic_trainable * 4 // shard, ""))
        # With checkpointing both models keep their layer inputs, and the backward
        # pass recomputes one layer of one model at a time (counted in ``act``).
        t = load.microbatch_tokens
        critic_act = gathered_bytes(shape, load, compute_bytes) + (
            shape.layers * t * shape.hidden * compute_bytes
            if checkpointing
            else shape.layers * layer_activation_bytes(shape, t, compute_bytes)
        )
        lines.append(Line("critic activations", critic_act, "the same micro-batch"))
    if config.kl_coeff and not config.lora_rank:
        lines.append(Line("KL reference (frozen)", params * model_bytes // shard, "kl_coeff > 0"))
    return lines


def kv_cache_bytes(shape: ModelShape, sequences: int, tokens: int, dtype_bytes: int) -> int:
    return 2 * shape.layers * shape.kv_dim * dtype_bytes * sequences * tokens


def engine_lines(
    config, shape: ModelShape, sequences: int, card_bytes: int | None, shares_weights: bool
) -> list[Line]:
    """A rollout engine holding ``sequences`` trajectories at the context limit."""
    dtype = config.engine_dtype_used
    b = DTYPE_BYTES[dtype]
    lines = []
    if shares_weights:
        lines.append(Line("engine weights", 0, "the learner's own weights, no copy"))
    else:
        lines.append(Line("engine weights", shape.params() * b, f"{dtype}, {config.engine}"))
    ctx = config.max_context_tokens
    if config.engine == "vllm":
        if config.vllm_kv_cache_gb is not None:
            kv = int(config.vllm_kv_cache_gb * GIB)
            note = "vllm_kv_cache_gb"
        else:
            kv = kv_cache_bytes(shape, sequences, ctx, b)
            note = f"{sequences} sequences x {ctx} tokens"
        lines.append(Line("engine KV cache", kv, note))
    else:
        rows = min(sequences, config.rollout_batch_size)
        kv = kv_cache_bytes(shape, rows, ctx, b)
        lines.append(Line("engine KV buffer", kv, f"{rows} rows x {ctx} tokens"))
        lines.append(Line("engine logits", rows * shape.vocab * 4, "one decode step, fp32"))
    return lines
