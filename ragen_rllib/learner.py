"""StarPOTorchLearner: the token-level PPO/GRPO loss on RLlib's TorchLearner.

Receives the batch built by the learner connector pipeline
(:mod:`ragen_rllib.connectors`): tokens, the response mask (1 on generated
tokens only), the rollout's log-probabilities, advantages and, with a critic,
value targets. The loss is the clipped policy surrogate (asymmetric clip,
dual clip, token-mean), minus the entropy bonus, plus an optional KL term to the
frozen initial model and the clipped value loss. Actor and critic have their
own AdamW optimizers and learning rates; RLlib clips the gradients per
optimizer by global norm.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np
import torch
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

from .core.batching import fill_plan, microbatch_rows, take_rows
from .core.losses import aggregate_loss, kl_penalty, policy_loss, value_loss
from .rl_module import response_logprobs

logger = logging.getLogger(__name__)


class NonFiniteUpdateError(RuntimeError):
    """Too many updates in a row had a non-finite loss or gradient norm."""


class TrajectoryMinibatches:
    """``num_epochs`` passes over a batch of trajectories in minibatches of
    ``minibatch_size`` trajectories.

    A trajectory may span several rows (one per turn under a context window):
    its rows always travel together, found through the ``row_trajectory``
    column (without it, every row is its own trajectory). Unlike RLlib's cyclic
    iterator, a batch that ``minibatch_size`` does not divide ends each epoch
    with one smaller minibatch: no trajectory is used twice in an epoch.
    Shuffling (``shuffle=True``) draws from a generator seeded by ``seed``, so a
    run restored from a checkpoint repeats it exactly.
    """

    def __init__(
        self,
        batch: MultiAgentBatch,
        *,
        minibatch_size: int | None,
        num_epochs: int,
        shuffle: bool,
        seed: int,
    ):
        self.batch = batch
        self.num_epochs = num_epochs
        self.shuffle = shuffle
        self.seed = seed
        # module -> the row indices of each trajectory, in trajectory order
        self.rows: dict[str, list[np.ndarray]] = {}
        for mid, module_batch in batch.policy_batches.items():
            n = len(module_batch)
            owner = (
                np.asarray(module_batch["row_trajectory"])
                if "row_trajectory" in module_batch
                else np.arange(n)
            )
            order = np.argsort(owner, kind="stable")
            cuts = np.flatnonzero(np.diff(owner[order])) + 1
            self.rows[mid] = np.split(order, cuts) if n else []
        most = max((len(r) for r in self.rows.values()), default=1)
        self.minibatch_size = minibatch_size or max(most, 1)

    def __iter__(self):
        if all("row_minibatch" in b for b in self.batch.policy_batches.values()):
            yield from self._planned()
            return
        rng = np.random.default_rng(self.seed)
        for _ in range(self.num_epochs):
            orders = {
                mid: rng.permutation(len(trajs)) if self.shuffle else np.arange(len(trajs))
                for mid, trajs in self.rows.items()
            }
            longest = max((len(t) for t in self.rows.values()), default=0)
            for start in range(0, longest, self.minibatch_size):
                parts = {}
                for mid, module_batch in self.batch.policy_batches.items():
                    chosen = orders[mid][start : start + self.minibatch_size]
                    if len(chosen):
                        rows = np.concatenate([self.rows[mid][i] for i in chosen])
                        index = torch.as_tensor(rows)
                        parts[mid] = SampleBatch({k: v[index] for k, v in module_batch.items()})
                yield MultiAgentBatch(parts, env_steps=max(len(p) for p in parts.values()))

    def _planned(self):
        """The minibatches the algorithm planned (``row_minibatch``, per epoch): the
        same for every learner, each learner holding its shard's part of each."""
        for epoch in range(self.num_epochs):
            plans = {}
            for mid, b in self.batch.policy_batches.items():
                column = b["row_minibatch"]
                column = column.cpu().numpy() if torch.is_tensor(column) else np.asarray(column)
                plans[mid] = column[:, epoch]
            steps = max((int(p.max()) + 1 for p in plans.values() if len(p)), default=0)
            for j in range(steps):
                parts = {}
                for mid, module_batch in self.batch.policy_batches.items():
                    rows = np.flatnonzero(plans[mid] == j)
                    if len(rows):
                        index = torch.as_tensor(rows)
                        parts[mid] = SampleBatch(
                            {k: v[index] for k, v in module_batch.items() if k != "row_minibatch"}
                        )
                yield MultiAgentBatch(parts, env_steps=max(len(p) for p in parts.values()))


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


class StarPOTorchLearner(TorchLearner):
    def build(self) -> None:
        super().build()
        self._nonfinite_in_a_row = 0
        self._reference = None
        # The KL reference is the initial model: under LoRA, the actor with its adapter
        # disabled (see _reference_logp); otherwise a frozen copy.
        if self.config.kl_coeff > 0 and not self.config.lora_rank:
            from transformers import AutoModelForCausalLM

            cfg = self.config.llm_module_config()
            self._reference = AutoModelForCausalLM.from_pretrained(
                cfg["model_path"], dtype=getattr(torch, cfg["dtype"])
            ).to(self._device)
            self._reference.eval().requires_grad_(False)

    def _parameter_counts(self, module_id: str) -> tuple[int, int]:
        """(trainable, total) parameters of a module (under LoRA: adapters, value head)."""
        counts = self.__dict__.setdefault("_counts", {})
        if module_id not in counts:
            module = self.module[module_id]
            module = module.unwrapped() if hasattr(module, "unwrapped") else module
            params = list(module.parameters())
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
        module = self.module[module_id]
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        with module.actor.disable_adapter():  # LoRA: the base model is the reference
            return response_logprobs(module.lm, batch, temperature, module._autocast)["logp"]

    # ----- FSDP ----------------------------------------------------------------------
    @property
    def _fsdp(self) -> bool:
        return self.config.learner_strategy == "fsdp" and self.config.num_learners > 1

    def _make_module(self):
        """The module, sharded with FSDP2 under ``learner_strategy: fsdp`` (before the
        optimizers are made, so that they hold the shards)."""
        module = super()._make_module()
        if self._fsdp:
            from .fsdp import shard_module

            bf16 = self.config.model_dtype == "bfloat16"
            for mid in module.keys():
                shard_module(module[mid], param_dtype=torch.bfloat16 if bf16 else None)
        return module

    def _make_modules_ddp_if_necessary(self) -> None:
        if not self._fsdp:
            super()._make_modules_ddp_if_necessary()

    def _sharded_units(self) -> list[torch.nn.Module]:
        if not self._fsdp:
            return []
        from .fsdp import sharded_units

        return [u for mid in self.module.keys() for u in sharded_units(self.module[mid])]

    def postprocess_gradients_for_module(self, *, module_id, config=None, module_gradients_dict):
        """FSDP: clip each optimizer's sharded gradients by their global norm (RLlib's
        clipping takes norms tensor by tensor, which a shard does not have)."""
        if not self._fsdp:
            return super().postprocess_gradients_for_module(
                module_id=module_id, config=config, module_gradients_dict=module_gradients_dict
            )
        from .fsdp import full

        config = config or self.config.get_config_for_module(module_id)
        for name, optimizer in self.get_optimizers_for_module(module_id):
            grads = self.filter_param_dict_for_optimizer(module_gradients_dict, optimizer)
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if config.grad_clip and grads:
                norm = torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
                self.metrics.log_value(
                    (module_id, f"gradients_{name}_global_norm"), full(norm).item(), window=1
                )
        return module_gradients_dict

    def _get_optimizer_state(self):
        """FSDP: the optimizers' full state, gathered on the CPU (every learner calls
        this; the first, rank 0, gets the state and the others an empty one)."""
        if not self._fsdp:
            return super()._get_optimizer_state()
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return {
            name: {
                "module_id": self._optimizer_name_to_module[name],
                "fsdp_state": get_optimizer_state_dict(
                    self.module[self._optimizer_name_to_module[name]], optim, options=options
                ),
            }
            for name, optim in self._named_optimizers.items()
        }

    def _set_optimizer_state(self, state) -> None:
        if not self._fsdp:
            return super()._set_optimizer_state(state)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        for name, entry in state.items():
            if "fsdp_state" not in entry:
                raise ValueError(
                    f"optimizer {name!r}: the checkpoint was not written by FSDP learners; "
                    "restore it with the learner_strategy it was written with"
                )
            set_optimizer_state_dict(
                self.module[entry["module_id"]],
                self._named_optimizers[name],
                optim_state_dict=entry["fsdp_state"],
                options=StateDictOptions(full_state_dict=True),
            )

    def _create_iterator_if_necessary(
        self,
        *,
        training_data,
        num_total_minibatches: int = 0,
        num_epochs: int = 1,
        minibatch_size: int | None = None,
        shuffle_batch_per_epoch: bool = False,
        **kwargs,
    ):
        batch = self._make_batch_if_necessary(training_data=training_data)
        return TrajectoryMinibatches(
            batch,
            minibatch_size=minibatch_size,
            num_epochs=num_epochs,
            shuffle=shuffle_batch_per_epoch,
            # A new seed per update, reproducible from the checkpointed counter.
            seed=int(self.config.seed or 0) * 1_000_003 + self._weights_seq_no,
        )

    # ----- micro-batches ---------------------------------------------------------------
    def _uncompiled_update(self, batch: dict[str, Any], **kwargs):
        """One optimizer step on a minibatch, in micro-batches of at most
        ``max_tokens_per_microbatch`` padded tokens whose gradients accumulate.

        Every loss term is divided by the minibatch's count of response tokens (or
        of sequences, for the seq-mean aggregations) over all learners, not by the
        micro-batch's, so the step is the same for any micro-batch size and any
        number of learners (DDP averages the learners' gradients, so each loss is
        also multiplied by the number of learners)."""
        self._compute_off_policyness(batch)
        ddp = self.config.num_learners > 1
        plans = {}
        for mid, module_batch in batch.items():
            lengths = module_batch["attention_mask"].sum(1).tolist()
            plans[mid] = microbatch_rows(lengths, self.config.max_tokens_per_microbatch)
            self._set_denominators(mid, module_batch)
        steps = max((len(p) for p in plans.values()), default=0)
        if self._fsdp:  # every forward is a collective: all learners run the same count
            from .fsdp import agreed_count

            steps = agreed_count(steps, self._device)
            plans = {mid: fill_plan(plan, steps) for mid, plan in plans.items()}
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        self._loss_finite = True
        self._stats: dict[str, dict[str, list]] = {mid: {} for mid in batch}
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
                    for mod in self.module.values():
                        if isinstance(mod, torch.nn.Module) and hasattr(mod, "no_sync"):
                            stack.enter_context(mod.no_sync())
                fwd_out = self.module.forward_train(micro)
                if blank:
                    _zero_weighted(fwd_out).backward()
                    continue
                losses = self.compute_losses(fwd_out=fwd_out, batch=micro)
                total = sum(losses.values())
                if isinstance(total, torch.Tensor) and total.grad_fn is not None:
                    total.backward()
            for mid, loss in losses.items():
                loss = loss.detach()
                self._loss_finite &= bool(torch.isfinite(loss))
                totals[mid] = totals[mid] + loss if mid in totals else loss
        self._log_stats()
        for mid in batch:  # every update, so every iteration's result holds them
            self.metrics.log_value((mid, "blank_passes"), blanks, window=1)
            trainable, total = self._parameter_counts(mid)
            self.metrics.log_value((mid, "trainable_parameters"), trainable, window=1)
            self.metrics.log_value((mid, "total_parameters"), total, window=1)
        gradients = {pid: p.grad for pid, p in self._params.items() if p.grad is not None}
        with contextlib.ExitStack() as stack:
            if ddp:
                for mod in self.module.values():
                    if isinstance(mod, torch.nn.Module) and hasattr(mod, "no_sync"):
                        stack.enter_context(mod.no_sync())
            self.apply_gradients(self.postprocess_gradients(gradients))
        return fwd_out, totals, {}

    def _set_denominators(self, module_id: str, module_batch: dict[str, Any]) -> None:
        """The minibatch's response tokens and sequences, summed over the learners."""
        from .fsdp import learner_count, summed_over_learners

        mask = module_batch["response_mask"] > 0
        counts = torch.stack([mask.sum(), mask.any(dim=1).sum()]).double()
        counts = summed_over_learners(counts, counts.device)
        world = learner_count()
        self._denoms = {
            "tokens": counts[0].clamp_min(1).float(),
            "sequences": counts[1].clamp_min(1).float(),
            "world": world,
        }

    def _add_stats(self, module_id: str, logs: dict[str, Any], tokens: torch.Tensor) -> None:
        """Collect one micro-batch's statistics (weighted by its response tokens)."""
        for key, value in logs.items():
            value = value.detach() if isinstance(value, torch.Tensor) else value
            self._stats[module_id].setdefault(key, []).append((value, tokens))

    #: Statistics that are already each micro-batch's share of the minibatch's value.
    _SUMMED = ("policy_loss", "entropy", "value_loss", "kl_to_reference", "response_tokens")

    def _log_stats(self) -> None:
        """Log each statistic once per minibatch: loss terms summed over its
        micro-batches, maxima as the maximum, the rest weighted by response tokens."""
        for mid, stats in self._stats.items():
            for key, parts in stats.items():
                values = torch.stack([torch.as_tensor(v, dtype=torch.float32) for v, _ in parts])
                weights = torch.stack([torch.as_tensor(w, dtype=torch.float32) for _, w in parts])
                if key.endswith("_max"):
                    value = values.max()
                elif key in self._SUMMED:
                    value = values.sum()
                else:
                    value = (values * weights).sum() / weights.sum().clamp_min(1)
                self.metrics.log_value((mid, key), value, window=1)

    # ----- numerical faults -----------------------------------------------------------
    def compute_gradients(self, loss_per_module, **kwargs):
        self._loss_finite = all(bool(torch.isfinite(v).all()) for v in loss_per_module.values())
        return super().compute_gradients(loss_per_module, **kwargs)

    def apply_gradients(self, gradients_dict) -> None:
        """Skip the optimizer step when the loss or the gradient norm is not finite."""
        from .fsdp import full

        grads = [g for g in gradients_dict.values() if g is not None]
        norms = torch.stack([full(torch.linalg.vector_norm(g.float())) for g in grads])
        norm = torch.linalg.vector_norm(norms)  # the global norm: inf or NaN if any part is
        finite = self._loss_finite and bool(torch.isfinite(norm))
        for module_id in self.module.keys():
            self.metrics.log_value((module_id, "skipped_nonfinite"), int(not finite), reduce="sum")
        if finite:
            self._nonfinite_in_a_row = 0
            super().apply_gradients(gradients_dict)
            return
        self._nonfinite_in_a_row += 1
        limit = self.config.max_nonfinite_updates
        logger.warning(
            "skipped an update: loss finite=%s, gradient norm %s (%d in a row, limit %d)",
            self._loss_finite,
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

    def configure_optimizers_for_module(self, module_id, config=None) -> None:
        module = self._module[module_id]
        module = module.unwrapped() if hasattr(module, "unwrapped") else module
        actor_params = module.actor_parameters()
        self.register_optimizer(
            module_id=module_id,
            optimizer_name="actor",
            optimizer=torch.optim.AdamW(actor_params, weight_decay=config.weight_decay),
            params=actor_params,
            lr_or_lr_schedule=config.lr,
        )
        critic_params = module.critic_parameters()
        if critic_params:
            self.register_optimizer(
                module_id=module_id,
                optimizer_name="critic",
                optimizer=torch.optim.AdamW(critic_params, weight_decay=config.weight_decay),
                params=critic_params,
                lr_or_lr_schedule=config.critic_lr,
            )

    def compute_loss_for_module(
        self, *, module_id: str, config, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> torch.Tensor:
        """This micro-batch's share of the minibatch's loss (see ``_uncompiled_update``)."""
        mask = batch["response_mask"].float()  # [B, T], 1 on generated tokens
        d = getattr(self, "_denoms", None) or {
            "tokens": mask.sum().clamp_min(1),
            "sequences": (mask.sum(1) > 0).sum().clamp_min(1).float(),
            "world": 1,
        }
        agg = config.loss_agg_used
        seq_agg = agg != "token-mean"
        tokens = d["tokens"]
        world = d["world"]

        def token_mean(x: torch.Tensor) -> torch.Tensor:
            return aggregate_loss(x, mask, "token-mean", denom=tokens)

        logp_new = fwd_out["logp"]  # [B, T]
        pg_loss, stats = policy_loss(
            logp_new,
            batch["old_logp"],
            batch["advantages"],
            mask,
            clip_low=config.clip_low,
            clip_high=config.clip_high,
            dual_clip=config.dual_clip,
            agg=agg,
            denom=d["sequences"] if seq_agg else tokens,
            norm_tokens=config.loss_norm_tokens,
        )
        entropy = token_mean(fwd_out["entropy"])
        total = pg_loss - config.entropy_coeff * entropy
        logs = {"policy_loss": pg_loss, "entropy": entropy, **stats}

        if config.kl_coeff > 0:
            ref_logp = self._reference_logp(module_id, batch)
            kl = token_mean(kl_penalty(logp_new, ref_logp, kind=config.kl_estimator))
            total = total + config.kl_coeff * kl
            logs["kl_to_reference"] = kl

        if "values" in fwd_out:
            vf_loss = value_loss(
                fwd_out["values"],
                batch["old_values"],
                batch["value_targets"],
                mask,
                clip=config.vf_clip,
                denom=tokens,
            )
            total = total + config.vf_loss_coeff * vf_loss
            logs["value_loss"] = vf_loss
            logs["value_mean"] = (fwd_out["values"].detach() * mask).sum() / mask.sum().clamp_min(1)

        micro_tokens = mask.sum()
        logs["response_tokens"] = micro_tokens
        if hasattr(self, "_stats"):
            self._add_stats(module_id, logs, micro_tokens)
        else:
            for key, value in logs.items():
                value = value.detach() if isinstance(value, torch.Tensor) else value
                self.metrics.log_value((module_id, key), value, window=1)
        return total * world
