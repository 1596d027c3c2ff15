"""LoRA (through peft): low-rank adapters train, the base model stays frozen.

Where it sits:

* **learner** (:class:`~ragen_rllib.rl_module.llm_rl_module.LLMRLModule`): with ``lora_rank > 0``
  the actor, and the critic when there is one, are wrapped by :func:`wrap`; only
  the adapters (and the critic's value head) are trainable. The KL reference is
  the actor with its adapter disabled, so no second copy of the model is held.
* **weight sync**: only the adapter's matrices travel to the rollout actors
  (:func:`adapter_weights`), a few MB instead of the model.
* **rollout actor** (:class:`~ragen_rllib.env_runner.llm_env_runner.LLMEnvRunner`): an
  :class:`AdapterMerger` keeps the base weights and merges every adapter it
  receives into them, W = W0 + (alpha / rank) * B @ A, before the engine loads
  the weights in place. Both engines (HF and vLLM) then sample at full speed
  with no adapter arithmetic per token. The merge always starts from W0, so
  errors do not pile up over updates; the cost is one copy of the base weights
  in the rollout actor's memory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

#: What peft's all-linear targets: every linear layer but the LM head.
ALL_LINEAR = "all-linear"
_PEFT_PREFIX = "base_model.model."


@dataclass(frozen=True)
class LoraSettings:
    """rank, alpha (the update is scaled by alpha / rank), dropout on the adapter's
    input, and the modules adapted: "all-linear" or a tuple of module names."""

    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: str | tuple[str, ...] = ALL_LINEAR

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_dict(cls, entry: dict[str, Any] | None) -> LoraSettings | None:
        if not entry:
            return None
        target = entry.get("target_modules", ALL_LINEAR)
        return cls(
            rank=int(entry["rank"]),
            alpha=float(entry["alpha"]),
            dropout=float(entry.get("dropout", 0.0)),
            target_modules=target if isinstance(target, str) else tuple(target),
        )


def wrap(model: torch.nn.Module, settings: LoraSettings) -> torch.nn.Module:
    """``model`` with LoRA adapters (a peft ``PeftModel``); only they are trainable."""
    from peft import LoraConfig, get_peft_model

    target = settings.target_modules
    config = LoraConfig(
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        bias="none",
    )
    with warnings.catch_warnings():
        # peft asks the model is_gradient_checkpointing, which transformers has renamed
        # and warns about on every wrap; nothing for this project's user to change.
        warnings.filterwarnings(
            "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
        )
        return get_peft_model(model, config)


def adapter_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's matrices under the base model's module names, e.g.
    ``model.layers.0.self_attn.q_proj.lora_A.weight`` ([rank, in]) and
    ``...lora_B.weight`` ([out, rank])."""
    from peft import get_peft_model_state_dict

    out = {}
    for key, value in get_peft_model_state_dict(model).items():
        name = key[len(_PEFT_PREFIX) :] if key.startswith(_PEFT_PREFIX) else key
        out[name] = value.detach().cpu()
    return out


class AdapterMerger:
    """The base model's weights, and each received adapter merged into them.

    ``base``: the rollout model's state dict as loaded (the LM head left out when
    it is tied to the embeddings, as the engines expect)."""

    def __init__(self, base: dict[str, torch.Tensor], settings: LoraSettings):
        self.base = {k: v.detach().to(torch.float32).clone() for k, v in base.items()}
        self.settings = settings

    @classmethod
    def from_pretrained(cls, model_path: str, settings: LoraSettings) -> AdapterMerger:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        state = {
            k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")
        }
        return cls(state, settings)

    def merged(self, adapter: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full state dict with W = W0 + scale * B @ A for every adapted module."""
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for key, value in adapter.items():
            for part in ("lora_A", "lora_B"):
                suffix = f".{part}.weight"
                if key.endswith(suffix):
                    pairs.setdefault(key[: -len(suffix)], {})[part] = torch.as_tensor(value)
                    break
            else:
                raise ValueError(f"adapter weight {key!r} is neither lora_A nor lora_B")
        out = dict(self.base)
        for module, ab in pairs.items():
            name = f"{module}.weight"
            if name not in self.base or set(ab) != {"lora_A", "lora_B"}:
                raise ValueError(
                    f"adapter for {module!r} does not match the rollout model (its weight "
                    f"{'is missing' if name not in self.base else 'needs lora_A and lora_B'})"
                )
            delta = ab["lora_B"].float() @ ab["lora_A"].float()  # [out, in]
            out[name] = self.base[name] + self.settings.scale * delta
        return out
