"""StarPOTorchLearner: RLlib's TorchLearner with StarPO's update.

Receives the batch built by the learner connectors
(:mod:`ragen_rllib.learner.connectors`): tokens, the response mask (1 on
generated tokens only), the behaviour log-probs, advantages and, with a critic,
value targets. Each minibatch is one optimizer step, taken in micro-batches of
at most ``max_tokens_per_microbatch`` padded tokens whose gradients accumulate;
the loss is :func:`~ragen_rllib.learner.loss.starpo_loss`. Actor and critic
have their own AdamW optimizers and learning rates, over float32 master weights
also with ``model_dtype: bfloat16`` (which sets the compute dtype: the module's
autocast, or FSDP2's mixed-precision policy), so AdamW's moments are float32;
the frozen KL reference is held in the compute dtype. RLlib clips the gradients
per optimizer by global norm. An update whose loss or gradient norm is not
finite is skipped and counted. FSDP's differences are
:class:`~ragen_rllib.learner.fsdp.FSDPLearnerMixin`'s.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from ragen_rllib.console import no_progress_bars
from ragen_rllib.distributed.collectives import agreed_count, full
from ragen_rllib.learner.fsdp import FSDPLearnerMixin
from ragen_rllib.learner.loss import Denominators, gap_over_learners, minibatch_logs, starpo_loss
from ragen_rllib.learner.minibatches import TrajectoryMinibatchesMixin
from ragen_rllib.maths import off_policy
from ragen_rllib.maths.batching import fill_plan, microbatches, take_rows
from ragen_rllib.records.metrics import learner_log
from ragen_rllib.rl_module.scoring import response_logprobs

logger = logging.getLogger(__name__)


class NonFiniteUpdateError(RuntimeError):
    """Too many updates in a row had a non-finite loss or gradient norm."""


def _row_with_response(module_batch: dict[str, Any]) -> dict[str, Any]:
    """One row of a minibatch that has a response token (the first), cut to its length."""
    has = (module_batch["response_mask"] > 0).any(1)
    row = int(torch.nonzero(has)[0]) if bool(has.any()) else 0
    return take_rows(module_batch, [row])


def _zero_weighted(fwd_out: dict[str, Any]) -> torch.Tensor:
    """0 times every output of a forward pass: a backward pass through the whole model
    (actor and critic) that adds nothing to any gradient."""
    parts, todo = [], [fwd_out]
    while todo:  # {module id: {name: tensor}}, nested
        for value in todo.pop().values():
            if isinstance(value, dict):
                todo.append(value)
            elif isinstance(value, torch.Tensor) and value.requires_grad:
                parts.append(value.sum())
    if not parts:
        raise RuntimeError("a forward pass produced no output that needs a gradient")
    return 0.0 * torch.stack(parts).sum()


def _gap_sums(part: dict[str, Any], fwd_out: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A micro-batch's share of the gap figures (:func:`off_policy.mismatch_sums`)."""
    return off_policy.mismatch_sums(
        fwd_out["logp"].detach(), part["behaviour_logp"], part["response_mask"], part["token_lag"]
    )


class StarPOTorchLearner(TrajectoryMinibatchesMixin, FSDPLearnerMixin, TorchLearner):
    def build(self) -> None:
        super().build()
        self._nonfinite_in_a_row = 0
        self._reference = None
        # The KL reference is the initial model: under LoRA, the actor with its adapter
        # disabled (see _reference_logp); otherwise a frozen copy.
        if self.config.kl_coeff > 0 and not self.config.lora_rank:
            from transformers import AutoModelForCausalLM

            cfg = self.config.llm_module_config()
            with no_progress_bars():
                reference = AutoModelForCausalLM.from_pretrained(
                    cfg["model_path"], dtype=getattr(torch, cfg["dtype"])
                )
            self._reference = reference.to(self.device)
            self._reference.eval().requires_grad_(False)

    def _unwrapped(self, module_id: str):
        module = self.module[module_id]
        return module.unwrapped() if hasattr(module, "unwrapped") else module

    def _parameter_counts(self, module_id: str) -> tuple[int, int]:
        """(trainable, total) parameters of a module (under LoRA: adapters, value head)."""
        counts = self.__dict__.setdefault("_counts", {})
        if module_id not in counts:
            params = list(self._unwrapped(module_id).parameters())
            counts[module_id] = (
                sum(p.numel() for p in params if p.requires_grad),
                sum(p.numel() for p in params),
            )
        return counts[module_id]

    @torch.no_grad()
    def _reference_logp(self, module_id: str, batch: dict[str, Any]) -> torch.Tensor:
        """log-probabilities of the batch's tokens under the reference policy  # [B, T]."""
        temperature = self.config.temperature or 1.0
        if self._reference is not None:
            return response_logprobs(self._reference, batch, temperature)["logp"]
        module = self._unwrapped(module_id)
        with module.actor.disable_adapter():  # LoRA: the base model is the reference
            return response_logprobs(module.lm, batch, temperature, module._autocast)["logp"]

    @torch.no_grad()
    def pair_loglik(
        self,
        prompts: list[list[int]],
        reasonings: list[list[int]],
        module_id: str = "default_policy",
    ) -> list[list[float]]:
        """``L[i][j] = log p(reasonings[j] | prompts[i])`` under the actor (the collapse
        metrics' prompt-reasoning matrix, :func:`~ragen_rllib.maths.collapse.pair_information`):
        every reasoning scored after every prompt, one row per pair, in micro-batches of
        ``max_tokens_per_microbatch`` padded tokens. Under FSDP every learner calls it
        with the same pairs, so all run the same forward passes."""
        module = self._unwrapped(module_id)
        rows = [(i, j, p + z) for i, p in enumerate(prompts) for j, z in enumerate(reasonings)]
        width = max(len(ids) for _, _, ids in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        scored = torch.zeros((len(rows), width))
        for r, (i, _, seq) in enumerate(rows):
            ids[r, : len(seq)] = torch.tensor(seq)
            attention[r, : len(seq)] = 1
            scored[r, len(prompts[i]) : len(seq)] = 1
        out = [[0.0] * len(reasonings) for _ in prompts]
        plan = microbatches(
            ids, attention, self.config.max_tokens_per_microbatch, module.shares_prefixes
        )
        for part in plan:
            batch = take_rows(
                {"input_ids": ids, "attention_mask": attention, "response_mask": scored}, part
            )
            batch = {k: v.to(self.device) for k, v in batch.items()}
            logp = module.score(batch)["logp"]
            sums = (logp * batch["response_mask"]).sum(1).tolist()
            for r, total in zip(part, sums, strict=True):
                out[rows[r][0]][rows[r][1]] = float(total)
        return out

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        """AdamW for the actor (``lr``) and, with a critic, one for it (``critic_lr``)."""
        self._shard_before_optimizers(module_id)
        module = self._unwrapped(module_id)
        roles = (
            ("actor", module.actor_parameters(), config.lr),
            ("critic", module.critic_parameters(), config.critic_lr),
        )
        for name, params, lr in roles:
            if params:
                self.register_optimizer(
                    module_id=module_id,
                    optimizer_name=name,
                    optimizer=torch.optim.AdamW(params, weight_decay=config.weight_decay),
                    params=params,
                    lr_or_lr_schedule=lr,
                )

    # ----- one optimizer step ------------------------------------------------------
    def compute_loss_for_module(
        self,
        *,
        module_id: str,
        config,
        batch: dict[str, Any],
        fwd_out: dict[str, Any],
        denoms: Denominators | None = None,
        logs: list[dict[str, torch.Tensor]] | None = None,
    ) -> torch.Tensor:
        """RLlib's loss API, :func:`~ragen_rllib.learner.loss.starpo_loss`.

        The update passes the minibatch's ``denoms`` (counts over all learners) and
        a ``logs`` list that collects each micro-batch's logged terms; called alone,
        ``batch`` is its own minibatch. A subclass that changes the loss overrides
        this method."""
        total, terms = starpo_loss(
            config,
            batch,
            fwd_out,
            denoms or Denominators.of(batch["response_mask"]),
            lambda: self._reference_logp(module_id, batch),
        )
        if logs is not None:
            logs.append(terms)
        return total

    def optimizer_step(self, batch: dict[str, Any], first: bool = False):
        """One optimizer step on a minibatch, in micro-batches of at most
        ``max_tokens_per_microbatch`` padded tokens whose gradients accumulate.

        Every loss term is divided by the minibatch's counts over all learners
        (:class:`~ragen_rllib.learner.loss.Denominators`), so the step is the same
        for any micro-batch size and any number of learners. ``first``: the update's
        first step, whose forward passes measure the engine-learner gap.
        Returns the forward outputs of the last micro-batch and the loss per module."""
        ddp = self.config.num_learners > 1
        plans, denoms = {}, {}
        for mid, module_batch in batch.items():
            plans[mid] = microbatches(
                module_batch["input_ids"],
                module_batch["attention_mask"],
                self.config.max_tokens_per_microbatch,
                self._unwrapped(mid).shares_prefixes,
            )
            denoms[mid] = Denominators.of(module_batch["response_mask"], over_learners=True)
        steps = max((len(p) for p in plans.values()), default=0)
        if self._fsdp:  # every forward is a collective: all learners run the same count
            steps = agreed_count(steps, self.device)
            plans = {mid: fill_plan(plan, steps) for mid, plan in plans.items()}
        for optim in self._optimizers():
            optim.zero_grad(set_to_none=True)
        loss_finite = True
        gap = first
        gap_sums: dict[str, list[dict[str, torch.Tensor]]] = {mid: [] for mid in batch}
        parts: dict[str, list[dict[str, torch.Tensor]]] = {mid: [] for mid in batch}
        totals: dict[str, torch.Tensor] = {}
        fwd_out: dict[str, Any] = {}
        blanks = 0
        for step in range(steps):
            micro = {
                mid: take_rows(batch[mid], plan[step])
                for mid, plan in plans.items()
                if step < len(plan)
            }
            # Several learners meet in every backward pass (and under FSDP in every
            # forward), so a pass with nothing to learn from (an added pass, or rows
            # without a response token) still runs the model, on a row that has one,
            # with its loss multiplied by 0.
            blank = ddp and any(not bool((m["response_mask"] > 0).any()) for m in micro.values())
            if blank:
                micro = {mid: _row_with_response(batch[mid]) for mid in micro}
                blanks += 1
            for unit in self._sharded_units():  # FSDP: reduce-scatter on the last only
                unit.set_requires_gradient_sync(step == steps - 1)
            with contextlib.ExitStack() as stack:
                if ddp and step < steps - 1:  # only the last backward all-reduces
                    self._no_sync(stack)
                fwd_out = self.module.forward_train(micro)
                if blank:
                    _zero_weighted(fwd_out).backward()
                    continue
                if gap:
                    for mid, part in micro.items():
                        if "token_lag" in part:
                            gap_sums[mid].append(_gap_sums(part, fwd_out[mid]))
                losses = {
                    mid: self.compute_loss_for_module(
                        module_id=mid,
                        config=self.config.get_config_for_module(mid),
                        batch=micro[mid],
                        fwd_out=fwd_out[mid],
                        denoms=denoms[mid],
                        logs=parts[mid],
                    )
                    for mid in micro
                }
                total = sum(losses.values())
                if isinstance(total, torch.Tensor) and total.grad_fn is not None:
                    total.backward()
            for mid, loss in losses.items():
                loss = loss.detach()
                loss_finite &= bool(torch.isfinite(loss))
                totals[mid] = totals[mid] + loss if mid in totals else loss
        if gap:
            self._log_gap(batch, gap_sums)
        for mid in batch:  # every update, so every iteration's result holds them
            for key, value in minibatch_logs(parts[mid], denoms[mid].world).items():
                learner_log(self.metrics, mid, key, value)
            learner_log(self.metrics, mid, "blank_passes", blanks)
            trainable, total_params = self._parameter_counts(mid)
            learner_log(self.metrics, mid, "trainable_parameters", trainable)
            learner_log(self.metrics, mid, "total_parameters", total_params)
        gradients = {
            self.get_param_ref(p): p.grad
            for optim in self._optimizers()
            for group in optim.param_groups
            for p in group["params"]
            if p.grad is not None
        }
        with contextlib.ExitStack() as stack:
            if ddp:
                self._no_sync(stack)
            self._apply_if_finite(self.postprocess_gradients(gradients), loss_finite)
        return fwd_out, totals

    def _optimizers(self) -> list[torch.optim.Optimizer]:
        """Every optimizer of every module (actor and, with a critic, critic)."""
        return [o for mid in self.module.keys() for _, o in self.get_optimizers_for_module(mid)]

    def _log_gap(self, batch, sums: dict[str, list[dict[str, torch.Tensor]]]) -> None:
        """The engine-learner gap of the update's first minibatch (its forward passes
        ran before any step, with the weights the proximal log-probs would have),
        reduced over all learners: the figures the learner connector logs for the
        whole batch when it scores it again, here for free on a part of it."""
        for mid in batch:
            if "token_lag" not in batch[mid]:
                continue  # the connector logged the whole batch's
            merged = off_policy.merged_sums(sums[mid])
            for key, value in gap_over_learners(merged, self.device).items():
                learner_log(self.metrics, mid, key, value)

    def _no_sync(self, stack: contextlib.ExitStack) -> None:
        """DDP: no gradient all-reduce inside ``stack``."""
        for mod in self.module.values():
            if isinstance(mod, torch.nn.Module) and hasattr(mod, "no_sync"):
                stack.enter_context(mod.no_sync())

    # ----- numerical faults -----------------------------------------------------------
    def _apply_if_finite(self, gradients_dict, loss_finite: bool) -> None:
        """Apply the gradients, unless the loss or the gradient norm is not finite."""
        grads = [g for g in gradients_dict.values() if g is not None]
        norms = torch.stack([full(torch.linalg.vector_norm(g.float())) for g in grads])
        norm = torch.linalg.vector_norm(norms)  # the global norm: inf or NaN if any part is
        finite = loss_finite and bool(torch.isfinite(norm))
        for module_id in self.module.keys():
            learner_log(self.metrics, module_id, "skipped_nonfinite", int(not finite))
        if finite:
            self._nonfinite_in_a_row = 0
            self.apply_gradients(gradients_dict)
            return
        self._nonfinite_in_a_row += 1
        limit = self.config.max_nonfinite_updates
        logger.warning(
            "skipped an update: loss finite=%s, gradient norm %s (%d in a row, limit %d)",
            loss_finite,
            float(norm),
            self._nonfinite_in_a_row,
            limit,
        )
        if self._nonfinite_in_a_row >= limit:
            raise NonFiniteUpdateError(
                f"{self._nonfinite_in_a_row} updates in a row had a non-finite loss or "
                f"gradient norm (max_nonfinite_updates={limit}); training stops. The newest "
                "checkpoint predates them. Lower lr, check the rewards for inf/NaN, or use "
                "float32 (model_dtype)."
            )
