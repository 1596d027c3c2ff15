"""BuiltinSpec: every parameter of the built-in model's build besides the seed.

All of them, :data:`BUILD_VERSION` and the vocabulary go into the build's key
(:func:`~ragen_rllib.builtin.model.build_key`), which names cached builds and
tells whether the shipped weights match this code.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bump when the build changes in a way the parameters below do not capture.
BUILD_VERSION = 5


@dataclass(frozen=True)
class BuiltinSpec:
    """Every build parameter besides the seed; all of them go into the cache key."""

    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32  # vLLM's CPU attention rejects 16
    intermediate_size: int = 384
    max_position_embeddings: int = 4096
    corpus_seeds: int = 50  # env seeds whose texts make up the vocabulary
    pretrain_steps: int = 1200
    # Each round of the envs' round robin holds an env with an action vocabulary (the
    # grids, the bandits, 2048) twice and a free-text env once: with all 16 envs alike,
    # the free-text envs' long transcripts took 60% of the loss, and the grid examples
    # learnt less (FrozenLakeNoSlip's RL result fell from 69.5% to 44.9%).
    action_env_repeats: int = 2
    free_text_env_repeats: int = 1
    pretrain_batch: int = 26  # transcripts per step: one round (10 x 2 + 6 x 1)
    # Single-turn snapshots per step (the envs in turn): the prompt a context window of 0
    # renders for a state reached by random play, and one answer. Short and cheap; most
    # of the practice at reading the grid happens here.
    pretrain_snapshots: int = 52
    pretrain_chunk_tokens: int = 2400  # padded tokens per forward pass (sorted by length)
    pretrain_lr: float = 3e-3
    pretrain_max_turns: int = 6  # answers per transcript at most
    # A transcript also ends after the answer that takes it past this many tokens: a
    # 9x9 Sudoku turn is ~450 tokens, and six of them would cost as much as all the
    # bandit transcripts of a step together.
    pretrain_max_tokens: int = 1200
    compact_share: float = 0.7  # share of compact prompts, and of compact instructions
    observation_weight: float = 4.0  # loss weight of the user messages after an answer
    coordinates_share: float = 0.5  # grid envs: share of episodes with the coordinates line

    def __post_init__(self) -> None:
        if self.head_dim < 32:
            raise ValueError(f"head_dim must be >= 32 (vLLM CPU attention), got {self.head_dim}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads {self.num_attention_heads} must be a multiple of "
                f"num_key_value_heads {self.num_key_value_heads}"
            )
