"""A decoder-only model's shape, read from its ``config.json`` (never its weights).

The memory planner needs the parameter count and the sizes behind activations
and the KV cache. They come from the model's Hugging Face config: a local
folder's ``config.json``, the built-in model's, or a hub id's through
transformers (which downloads the config file only). When a hub id cannot be
read (no network), the shapes of a few common models are known here, so a plan
for another machine can still be made.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama/Qwen2-style decoder (attention with grouped KV heads,
    a gated MLP, RMSNorm)."""

    name: str
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    qkv_bias: bool = True
    source: str = "config.json"

    @property
    def kv_dim(self) -> int:
        """Width of the keys (or of the values) of one token in one layer."""
        return self.kv_heads * self.head_dim

    def layer_params(self) -> int:
        h, kv, q = self.hidden, self.kv_dim, self.heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h
        if self.qkv_bias:
            attention += q + 2 * kv
        mlp = 3 * h * self.intermediate
        return attention + mlp + 2 * h  # two RMSNorm weights

    def params(self) -> int:
        """Every parameter of the causal LM (a tied LM head counted once)."""
        embed = self.vocab * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        return embed + head + self.layers * self.layer_params() + self.hidden

    def backbone_params(self) -> int:
        """The transformer without an LM head (what a critic copies)."""
        return self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of rank ``rank`` on every linear layer of the blocks."""
        h, kv, q, i = self.hidden, self.kv_dim, self.heads * self.head_dim, self.intermediate
        shapes = [(h, q), (h, kv), (h, kv), (q, h), (h, i), (h, i), (i, h)]
        return self.layers * sum(rank * (a + b) for a, b in shapes)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str, source: str = "config.json"):
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            return cls(
                name=name,
                vocab=int(cfg["vocab_size"]),
                hidden=hidden,
                intermediate=int(cfg["intermediate_size"]),
                layers=int(cfg["num_hidden_layers"]),
                heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                tied=bool(cfg.get("tie_word_embeddings", False)),
                qkv_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                source=source,
            )
        except KeyError as err:
            raise ValueError(
                f"the config of {name!r} has no {err.args[0]!r}: the planner knows decoder-only "
                "models with hidden_size, intermediate_size, num_hidden_layers, "
                "num_attention_heads and vocab_size"
            ) from None


def _qwen25(hidden: int, inter: int, layers: int, heads: int, kv: int, tied: bool, vocab: int):
    return {
        "model_type": "qwen2",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "tie_word_embeddings": tied,
    }


#: Published shapes of the Qwen2.5 models (their config.json values), used when a hub
#: id cannot be read here. The Instruct models share their base model's shape.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen/qwen2.5-0.5b": _qwen25(896, 4864, 24, 14, 2, True, 151936),
    "qwen/qwen2.5-1.5b": _qwen25(1536, 8960, 28, 12, 2, True, 151936),
    "qwen/qwen2.5-3b": _qwen25(2048, 11008, 36, 16, 2, True, 151936),
    "qwen/qwen2.5-7b": _qwen25(3584, 18944, 28, 28, 4, False, 152064),
}


def known_shape(name: str) -> ModelShape | None:
    key = name.lower().removesuffix("-instruct")
    cfg = KNOWN_CONFIGS.get(key)
    return None if cfg is None else ModelShape.from_config(cfg, name, source="known shape")


@functools.cache
def model_width(llm: str) -> int | None:
    """The ``hidden_size`` of the model ``llm`` names (:func:`load_shape`, once per
    process); None where its shape cannot be had."""
    try:
        return load_shape(llm).hidden
    except (OSError, ValueError):
        return None


def load_shape(llm: str) -> ModelShape:
    """The shape of the config's ``llm``: the built-in model, a local folder or a hub id."""
    from ragen_rllib.models.resolve import resolve_model

    known = known_shape(llm)
    path = resolve_model(llm)
    if os.path.isdir(path):
        with open(os.path.join(path, "config.json")) as f:
            return ModelShape.from_config(json.load(f), llm)
    from ragen_rllib.models.hub import hub_offline, hub_reachable

    if known is not None and (hub_offline() or not hub_reachable()):
        return known
    try:
        from transformers import AutoConfig

        return ModelShape.from_config(AutoConfig.from_pretrained(path).to_dict(), llm)
    except OSError as err:
        if known is not None:
            return known
        raise ValueError(
            f"cannot read the config.json of llm={llm!r} ({err}); give a local model folder, "
            f"or one of the known shapes: {', '.join(sorted(KNOWN_CONFIGS))}"
        ) from None
