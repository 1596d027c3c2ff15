"""Rollout engines: token ids in, sampled token ids and their log-probabilities out.

Sits inside the env runner. The env runner gives the engine the token ids of
every active trajectory at a turn; the engine samples one answer per
trajectory, in one batch, and returns the sampled ids with the log-probability
of each under the temperature-scaled distribution ``softmax(logits / T)``
(before top-p truncation). The learner recomputes exactly that quantity, so
``logp_old`` and the first update's ``logp_new`` agree (token in, token out).

``HFEngine`` is the CPU default: Hugging Face transformers with a hand-written
sampling loop over the KV cache, so the log-probabilities come from the same
forward pass that chose the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class SamplingParams:
    """temperature: softmax temperature (0 means greedy); top_p: nucleus mass kept;
    max_new_tokens: tokens generated per turn at most."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 64

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class Generation:
    """One sampled answer: its ids (the eos id included when it stopped there),
    their log-probabilities, and whether it ended with eos."""

    ids: list[int]
    logprobs: list[float]
    ended_with_eos: bool


class RolloutEngine(Protocol):
    """What the env runner needs from an inference engine."""

    weights_version: int

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int
    ) -> list[Generation]: ...

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None: ...


def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator):
    """Pick one token per row of ``logits  # [B, V]``; return (token [B], logp [B])."""
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
    token = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    return token, logp_all.gather(-1, token[:, None]).squeeze(-1)


class HFEngine:
    """Batched sampling with a transformers causal LM.

    Args:
        model_path: a Hugging Face model directory or hub id.
        eos_token_id / pad_token_id: ids that end an answer / fill padding.
        dtype: "float32" or "bfloat16".
        device: torch device string.
        max_batch_size: prompts per forward batch at most (memory bound).
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
    ) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            model_path, dtype=getattr(torch, dtype)
        ).to(device)
        self.model.eval()
        self.model.requires_grad_(False)
        self.eos_token_id = int(eos_token_id)
        self.pad_token_id = int(pad_token_id)
        self.device = torch.device(device)
        self.max_batch_size = max_batch_size
        self.weights_version = 0

    def load_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        missing, unexpected = self.model.load_state_dict(state_dict, strict=False)
        # Tied embeddings may be absent from the state dict; anything else is a mismatch.
        missing = [k for k in missing if k != "lm_head.weight"]
        if missing or unexpected:
            raise ValueError(
                f"weights do not match the rollout model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        self.weights_version = int(version)

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seed: int
    ) -> list[Generation]:
        gen = torch.Generator(device=self.device).manual_seed(int(seed))
        out: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            out.extend(
                self._generate_batch(prompts[start : start + self.max_batch_size], params, gen)
            )
        return out

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, gen: torch.Generator
    ) -> list[Generation]:
        n, width = len(prompts), max(len(p) for p in prompts)
        # Left padding, so every row's next token sits in the last column.
        input_ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attention[i, width - len(p) :] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        # Positions count real tokens only, as in the learner's right-padded batch.
        positions = (attention.cumsum(-1) - 1).clamp(min=0)

        result = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True
        )
        cache, logits = result.past_key_values, result.logits[:, -1]
        next_pos = positions[:, -1:] + 1
        ids = [[] for _ in range(n)]
        logps = [[] for _ in range(n)]
        finished = torch.zeros(n, dtype=torch.bool, device=self.device)
        for _ in range(params.max_new_tokens):
            token, logp = _sample(logits, params, gen)
            token = torch.where(finished, torch.full_like(token, self.pad_token_id), token)
            # One device-to-host copy per step, not one per row.
            token_list, logp_list = token.tolist(), logp.tolist()
            for i in torch.nonzero(~finished).flatten().tolist():
                ids[i].append(token_list[i])
                logps[i].append(logp_list[i])
            finished |= token == self.eos_token_id
            if bool(finished.all()):
                break
            attention = torch.cat(
                [attention, torch.ones((n, 1), dtype=attention.dtype, device=self.device)], 1
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
        return [
            Generation(ids[i], logps[i], bool(ids[i]) and ids[i][-1] == self.eos_token_id)
            for i in range(n)
        ]
