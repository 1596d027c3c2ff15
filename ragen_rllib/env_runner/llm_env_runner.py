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
from ragen_rllib.env_choice.env_mix import entry_of_group, format_of, mix_entries
from ragen_rllib.env_choice.eval_suites import EvalEnv
from ragen_rllib.env_runner.lockstep import LockstepPlayer
from ragen_rllib.env_runner.metrics import evaluation_metrics
from ragen_rllib.env_runner.players import AgentPlayer, Batch, Player
from ragen_rllib.env_runner.self_play.games import is_self_play
from ragen_rllib.env_runner.self_play.player import SelfPlayPlayer
from ragen_rllib.env_runner.self_play.snapshots import Opponents
from ragen_rllib.env_runner.turns import Turns
from ragen_rllib.maths.seeding import mix_seed, training_group_seeds
from ragen_rllib.models.lora import AdapterMerger, LoraSettings
from ragen_rllib.records.metrics import ENV_RUNNERS, run_log
from ragen_rllib.records.trajectory import Trajectory
from ragen_rllib.warmup.format_warmup import model_path

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
        self.chat = self.chat_for(format_of(self._mix[0], config))
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
        self.turns = Turns(self)  # a turn's steps (shared by the lockstep and self-play players)
        self._opponents = None  # self-play against snapshots of the trained policy
        if config.opponent_setup is not None:
            self._opponents = Opponents(
                config.opponent_setup,
                config.opponent_snapshot_interval,
                config.opponent_pool_size,
                lambda: make_engine(config, self._model_path, self.tokenizer),
            )
        # The players, one per rollout mode (env_runner/players.py); whether the run
        # plays itself is resolved once (null: from the env's factory).
        self._plays_itself = config.self_play_used
        self._lockstep = LockstepPlayer(self, self._load_newer_weights)
        self._self_play = SelfPlayPlayer(self, self._opponents)
        self._agents: AgentPlayer | None = None  # with `agent`: made on first use

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
        if self._plays_itself and env is None:  # both seats of each game: pairs
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
        if self._mailbox is None:
            return
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
    def chat_for(self, fmt: PromptFormat) -> ChatFormat:
        """The chat format of the prompt wording ``fmt`` (made on first use)."""
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
        """Play one trajectory per seed with the player of the run's mode
        (:mod:`ragen_rllib.env_runner.players`: lockstep, self-play or agent
        programs), and log a training batch's sampling (``log_metrics``).

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
        batch = Batch(seeds, groups, params, sample_seed, reset_options, log_metrics, split, env)
        start = time.perf_counter()  # the envs' making counts (a remote one connects)
        reused_before = self.engine.prompt_tokens_reused
        played = self._player(batch).play(batch)
        if batch.training:
            self._log_sampling(time.perf_counter() - start, played.generated, reused_before)
            for key, value in played.metrics.items():
                self._log(key, value, window=1)
        return played.trajectories

    def _player(self, batch: Batch) -> Player:
        """The batch's player; for the env modes, the batch's envs are made here."""
        if self.config.agent is not None:
            self._agents = self._agents or AgentPlayer(self)
            return self._agents
        batch.entries = [batch.env or entry_of_group(self._mix, g) for g in batch.groups]
        batch.envs = self._make_envs(batch.entries)
        if self._plays_itself and is_self_play(batch.envs):
            return self._self_play
        return self._lockstep

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
