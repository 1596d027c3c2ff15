"""LLMEnvRunner: the RLlib EnvRunner that plays P groups x N rollouts in lockstep.

Data flow: for each of the P initial states (env groups) N copies of the env are
reset with the same seed; every turn the runner gathers the token ids of all
active trajectories, asks the rollout engine for one answer each (one batch),
decodes each answer only to hand its text to the env, appends the env's next
observation as tokens, and stops a trajectory when its env terminates or
truncates, when it has had K turns, or when its context would overflow.
``sample()`` returns :class:`~ragen_rllib.records.trajectory.Trajectory`
records, which the StarPO algorithm filters and the learner trains on.

A rollout actor imports no learner code: it holds a rollout engine
(:mod:`ragen_rllib.engines`) and receives the actor's weights, stamped with
their policy version, from the algorithm after every update.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import gymnasium as gym
import numpy as np
import ray
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

from ragen_rllib.agents.programs import AgentRollouts
from ragen_rllib.chat.prompts import ChatFormat, PromptFormat
from ragen_rllib.console import quiet
from ragen_rllib.distributed.host_memory import trim_host_heap
from ragen_rllib.distributed.wire import from_wire, is_wire
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.engines.factory import make_engine
from ragen_rllib.env_choice.env_loading import (
    import_env_modules,
    make_env,
    make_eval_env,
)
from ragen_rllib.env_choice.env_mix import entry_of_group, format_of, mix_entries, turns_of
from ragen_rllib.env_choice.eval_suites import EvalEnv
from ragen_rllib.env_runner.metrics import evaluation_metrics
from ragen_rllib.env_runner.opponents import Opponents
from ragen_rllib.env_runner.rollout_state import Rollout
from ragen_rllib.env_runner.self_play import is_self_play, play_games, seat_envs
from ragen_rllib.env_runner.turns import Turns
from ragen_rllib.maths.seeding import mix_seed, training_group_seeds
from ragen_rllib.models.lora import AdapterMerger, LoraSettings
from ragen_rllib.models.warmup import model_path
from ragen_rllib.records.metrics import ENV_RUNNERS, run_log
from ragen_rllib.records.trajectory import Trajectory

logger = logging.getLogger(__name__)
quiet()


def token_spaces(vocab_size: int, max_len: int) -> tuple[gym.Space, gym.Space]:
    """The RL module's view: observations are token-id sequences, actions are tokens."""
    obs = gym.spaces.Box(0, vocab_size - 1, shape=(max_len,), dtype=np.int64)
    return obs, gym.spaces.Discrete(vocab_size)


class LLMEnvRunner(EnvRunner, Checkpointable):
    """Samples multi-turn trajectories from text envs with an LLM rollout engine."""

    def __init__(self, *, config, **kwargs):
        super().__init__(config=config, **kwargs)
        from transformers import AutoTokenizer

        import_env_modules(config)  # this process may be a fresh Ray worker

        self._model_path = model_path(config)
        self.tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        self._mix = mix_entries(config)
        # One chat format per prompt wording in use (made on first use: the system
        # prompt and the prefill may differ between the envs of a mixture).
        self._chats: dict[PromptFormat, ChatFormat] = {}
        self.chat = self._chat(format_of(self._mix[0], config))
        self.engine = make_engine(config, self._model_path, self.tokenizer)
        # LoRA: the learner sends adapters, merged here into the base weights.
        self._lora = None
        settings = LoraSettings.from_dict(config.lora_settings())
        if settings is not None:
            self._lora = AdapterMerger.from_pretrained(self._model_path, settings)
        # One pool per env and options (EvalEnv.key): a mixture entry's or a suite's.
        self._envs: dict[str, list[gym.Env]] = {}
        self._num_sample_calls = 0
        self.num_groups_sampled = 0  # lifetime, this runner (restarts from 0 with it)
        # This runner's own seed stream (sample() on its own); the algorithm hands
        # its runners their groups' seeds from the driver's stream instead.
        self._base_seed = mix_seed(config.seed, self.worker_index)
        # Partial rollouts: where newer weights are posted during a sample, and the
        # version last loaded from there (its queued push is then not loaded again).
        self._mailbox = None
        self._version_from_mailbox = -1
        self._agents: AgentRollouts | None = None  # with `agent`: made on first use
        self._turns = Turns(self)  # a turn's steps (shared with the self-play loop)
        self._opponents = None  # self-play against snapshots of the trained policy
        if config.opponent_setup is not None:
            self._opponents = Opponents(
                config.opponent_setup,
                config.opponent_snapshot_interval,
                config.opponent_pool_size,
                lambda: make_engine(config, self._model_path, self.tokenizer),
            )

    # ----- EnvRunner API ------------------------------------------------------------
    def assert_healthy(self) -> None:
        if self.engine is None or self.engine.model is None:
            raise RuntimeError("LLMEnvRunner has no rollout engine")

    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        env = make_env(self.config)
        module_spaces = token_spaces(len(self.tokenizer), self.config.max_context_tokens)
        return {
            "__env__": (env.observation_space, env.action_space),
            DEFAULT_MODULE_ID: module_spaces,
        }

    def sample(self, **kwargs) -> list[Trajectory]:
        """One batch of env_groups x group_size trajectories from this runner's own
        seed stream (a runner used on its own; the StarPO algorithm hands its
        runners their groups through :meth:`sample_groups`)."""
        group_seeds, sample_seed = self.training_group_seeds(self._num_sample_calls)
        self._num_sample_calls += 1
        return self.sample_groups(group_seeds, list(range(len(group_seeds))), sample_seed)

    def sample_groups(
        self, group_seeds: list[int], groups: list[int], sample_seed: int, reset_options=None
    ) -> list[Trajectory]:
        """group_size trajectories from each initial state ``group_seeds[i]``, labelled
        with group id ``groups[i]``; ``sample_seed`` seeds the engine's sampling, and
        ``reset_options`` (a curriculum stage's) go to every env's reset()."""
        cfg = self.config
        seeds = [s for s in group_seeds for _ in range(cfg.group_size)]
        labels = [g for g in groups for _ in range(cfg.group_size)]
        params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
        trajs = self.run_episodes(seeds, labels, params, int(sample_seed), reset_options)
        trim_host_heap()  # the batch's keys and values, freed (distributed/host_memory.py)
        self.num_env_steps_sampled_lifetime += sum(len(t) for t in trajs)
        self.num_groups_sampled += len(group_seeds)
        self._log("num_groups_sampled_lifetime", self.num_groups_sampled, window=1)
        return trajs

    def training_group_seeds(self, call: int) -> tuple[list[int], int]:
        """The initial-state seeds of this runner's ``call``-th ``sample()`` (one per
        group) and that call's sampling seed."""
        return training_group_seeds(self._base_seed, call, self.config.env_groups)

    def evaluate(
        self,
        num_states: int,
        first_seed: int,
        temperature: float,
        env: EvalEnv | None = None,
        samples_per_state: int = 1,
        pass_k: tuple[int, ...] = (1,),
    ) -> tuple[dict[str, float], list[Trajectory]]:
        """``samples_per_state`` trajectories on each of ``num_states`` fixed initial
        states of the training env, or of a suite's ``env``; the states are the
        groups, so pass@k (each k in ``pass_k``) comes from each state's samples. In
        self-play the training env's states are played by both seats (twice the
        trajectories, a game per sample)."""
        if self.config.self_play_used and env is None:  # both seats of each game: pairs
            samples_per_state *= 2
        seeds = [first_seed + i for i in range(num_states) for _ in range(samples_per_state)]
        states = [i for i in range(num_states) for _ in range(samples_per_state)]
        params = SamplingParams(temperature, self.config.top_p, self.config.max_new_tokens)
        trajs = self.run_episodes(
            seeds, states, params, first_seed, log_metrics=False, env=env, split="eval"
        )
        trim_host_heap()
        return evaluation_metrics(trajs, tuple(pass_k)), trajs

    def release_engine(self) -> str:
        """Free the engine's memory for the learner's update (engine_sleep_level); the
        next weights wake it. Counted under engine/releases and engine/sleeps_skipped."""
        done = self.engine.release()
        if self._opponents is not None:
            self._opponents.release()
        self._log(("engine", "releases"), 1, reduce="sum")
        if done != "slept":
            self._log(("engine", "sleeps_skipped"), 1, reduce="sum")
        return done

    def get_metrics(self) -> dict[str, Any]:
        return self.metrics.reduce()

    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        # The weights live with the learner; a runner only carries its counters.
        return {
            "num_sample_calls": self._num_sample_calls,
            "policy_version": self.engine.policy_version,
            "num_env_steps_sampled_lifetime": self.num_env_steps_sampled_lifetime,
        }

    def set_mailbox(self, mailbox) -> None:
        """Partial rollouts: look for newer weights in ``mailbox`` between turns
        (:class:`~ragen_rllib.distributed.mailbox.WeightMailbox`)."""
        self._mailbox = mailbox

    def _load_newer_weights(self) -> None:
        """Between two turns of a training sample: load weights newer than the
        engine's, if the driver posted some (the tokens after carry their version)."""
        version, refs = ray.get(self._mailbox.newer_than.remote(self.engine.policy_version))
        if not refs:
            return
        self.set_state(ray.get(refs[0]))
        self.engine.clear_cache()  # the cached prompts were encoded by the old weights
        self._version_from_mailbox = version
        self._log("weights_loaded_mid_sample", 1, reduce="sum")

    def set_state(self, state: dict[str, Any]) -> None:
        """Counters from a checkpoint, and/or the actor's weights (pushed by the algorithm,
        possibly as a reference into Ray's object store)."""
        if isinstance(state, ray.ObjectRef):
            state = ray.get(state)
        version = int(state.get(WEIGHTS_SEQ_NO, 0))
        if COMPONENT_RL_MODULE in state and version == self._version_from_mailbox:
            state = {k: v for k, v in state.items() if k != COMPONENT_RL_MODULE}  # loaded
        if COMPONENT_RL_MODULE in state:
            module_state = state[COMPONENT_RL_MODULE]
            if isinstance(module_state, ray.ObjectRef):  # RLlib's own sync at setup
                module_state = ray.get(module_state)
            module_state = module_state.get(DEFAULT_MODULE_ID, module_state)
            # The actor's weights under the rollout model's names (the RL module's
            # inference-only state), as NumPy arrays from the object store or tensors.
            weights = from_wire(module_state) if is_wire(module_state) else module_state
            start = time.perf_counter()
            if self._lora is not None:
                weights = self._lora.merged(weights)
            self.engine.load_weights(weights, version)
            if self._opponents is not None:
                self._opponents.record(weights, version)
            self._log("weights_load_s", time.perf_counter() - start, window=1)
        self._num_sample_calls = int(state.get("num_sample_calls", self._num_sample_calls))
        self.num_env_steps_sampled_lifetime = int(
            state.get("num_env_steps_sampled_lifetime", self.num_env_steps_sampled_lifetime)
        )

    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config, "worker_index": self.worker_index}

    def stop(self) -> None:
        if self._agents is not None:
            self._agents.shutdown()
        for pool in self._envs.values():
            for env in pool:
                env.close()

    # ----- rollout ------------------------------------------------------------------
    def _chat(self, fmt: PromptFormat) -> ChatFormat:
        if fmt not in self._chats:
            self._chats[fmt] = ChatFormat(self.tokenizer, fmt.system, fmt.prefill)
        return self._chats[fmt]

    def _make_envs(self, entries: list[EvalEnv]) -> list[gym.Env]:
        """One env per trajectory, from each entry's pool (made on first use, kept)."""
        taken: dict[str, int] = {}
        envs = []
        for entry in entries:
            pool = self._envs.setdefault(entry.key, [])
            i = taken[entry.key] = taken.get(entry.key, -1) + 1
            if i == len(pool):
                pool.append(make_eval_env(entry))
            envs.append(pool[i])
        return envs

    def run_episodes(
        self,
        seeds: list[int],
        groups: list[int],
        params: SamplingParams,
        sample_seed: int,
        reset_options: dict | None = None,
        log_metrics: bool = True,
        env: EvalEnv | None = None,
        split: str = "train",
    ) -> list[Trajectory]:
        """Play one trajectory per seed, all turns batched through the engine (with
        ``agent`` set, the agent plays each on a task of ``split``: agents/programs.py).

        With ``context_window: null`` a trajectory's prompt is its whole history,
        one growing token sequence (one segment). With ``context_window: k`` the
        prompt at turn t holds the instructions and the last k turns before
        turn t; each turn becomes its own segment (that prompt plus the answer).

        An env's exception in ``reset()`` or ``step()`` (or a non-text observation)
        ends that trajectory with ``end_reason="env_error"`` and the error; the batch
        goes on, and the algorithm drops the failed groups before the update
        (:class:`~ragen_rllib.connectors.sample_batch.DropEnvErrorGroups`).

        ``env`` (an evaluation suite's, or a mixture entry) plays every seed instead
        of the training envs, where group ``g`` plays its mixture entry
        (:mod:`ragen_rllib.env_choice.env_mix`) with its turn limit and prompt style.
        """
        cfg = self.config
        if cfg.agent is not None:  # an agent program plays each trajectory (agents/)
            self._agents = self._agents or AgentRollouts(cfg, self.engine, self.tokenizer)
            log = (self.metrics, self._log_sampling) if log_metrics else None
            return self._agents.run(seeds, groups, params, split, sample_seed, log)
        start = time.perf_counter()  # the envs' making counts (a remote one connects)
        entries = [env or entry_of_group(self._mix, g) for g in groups]
        envs = self._make_envs(entries)
        self_play = cfg.self_play_used and is_self_play(envs)
        if self_play:  # the group's envs pair up, two seats of one game
            seat_envs(envs, groups)
        options = {} if reset_options is None else {"options": reset_options}  # curriculum
        # The N trajectories of a group start from one state, so from one first prompt:
        # each distinct first prompt is encoded once per call (encoding every copy was
        # over half the runner's own time per Bandit sample; bench_async.py --device-time).
        first_ids: dict[tuple[PromptFormat, str], list[int]] = {}
        rollouts = []
        for entry, env_, seed, group in zip(entries, envs, seeds, groups, strict=True):
            fmt = format_of(entry, cfg)
            chat = self._chat(fmt)
            traj = Trajectory(
                env_id=entry.env,
                env_name=entry.name,
                seed=seed,
                group=group,
                policy_version=self.engine.policy_version,
                prefill=chat.prefill,
            )
            roll = Rollout(traj, env_, fmt, chat, turns_of(entry, cfg.max_turns))
            rollouts.append(roll)
            if not self_play:
                self._turns.begin(roll, options, first_ids, params.max_new_tokens)

        generated = 0
        reused_before = self.engine.prompt_tokens_reused
        active = [r for r in rollouts if r.context is not None]
        self.engine.clear_cache()
        if self_play and self._opponents is not None:  # which policy plays each seat
            self._opponents.seat(rollouts, seeds, groups)
            self._opponents.draw(sample_seed)
            self._opponents.clear_caches()
        if self_play:
            generate = functools.partial(self._generate, params, sample_seed)
            generated = play_games(self._turns, rollouts, generate, options, params.max_new_tokens)
            active = []
        for turn in range(1, max((r.limit for r in rollouts), default=0) + 1):
            if not active:
                break
            if turn > 1 and self._mailbox is not None and log_metrics:
                self._load_newer_weights()  # partial rollouts
            # Keyed by trajectory: a turn encodes only what its previous context lacks.
            keys = [id(r) for r in active]
            batch = [r.context.prompt for r in active]
            gens = self.engine.generate(batch, params, seed=sample_seed + turn, cache_keys=keys)
            generated += sum(len(g.ids) for g in gens)
            active = [
                r for r, g in zip(active, gens, strict=True)
                if self._turns.play(r, g, turn, params.max_new_tokens)
            ]  # fmt: skip
        self.engine.clear_cache()
        if log_metrics:
            self._log_sampling(time.perf_counter() - start, generated, reused_before)
        if self._opponents is not None and self_play:
            self._opponents.clear_caches()
            if log_metrics:
                for key, value in self._opponents.metrics().items():
                    self._log(key, value, window=1)
            return self._opponents.kept(rollouts)  # the trained policy's trajectories
        return [r.traj for r in rollouts]

    def _generate(self, params, seed: int, prompts, keys, offset: int, policy=None):
        engine = self.engine if policy is None else self._opponents.engine(policy)
        return engine.generate(prompts, params, seed=seed + offset, cache_keys=keys)

    def _log(self, key: str | tuple[str, ...], value, **kwargs) -> None:
        """Log a declared metric (``env_runners/<key>`` in the algorithm's result)."""
        run_log(self.metrics, key, value, under=ENV_RUNNERS, **kwargs)

    def _log_sampling(self, elapsed: float, generated: int, reused_before: int) -> None:
        self._log("rollout_time_s", elapsed, window=1)
        self._log("generated_tokens", generated, window=1)
        self._log("generated_tokens_per_s", generated / max(elapsed, 1e-9), window=1)
        # Prompt tokens the engine took from its prefix cache instead of encoding.
        reused = self.engine.prompt_tokens_reused - reused_before
        self._log("prompt_tokens_reused", reused, window=1)
