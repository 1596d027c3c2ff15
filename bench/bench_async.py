"""Asynchronous against synchronous training throughput, side by side in one run.

Runs the same experiment config in several modes, each for ``--warmup`` untimed
and ``--iterations`` timed iterations, and prints iterations per second, the
mean stage times (waiting for the sample, the runner's rollout, the update, the
weight sync), the idle shares and the policy lag of each mode, and the ratio of
each mode's throughput to the synchronous baseline's.

Modes (``--modes``, comma-separated):

- ``sync-local``: the runner in the driver (no remote actor); sampling and the
  update take turns, each with ``--threads`` torch threads;
- ``sync-remote`` / ``sync-remote-2``: one or two remote runner actors (one
  thread each; two split the groups), still in lockstep; the learner uses
  ``--threads`` (the actors wait while it updates);
- ``async`` / ``async-2``: one or two runner actors sample batch i+1 while the
  driver's learner updates on batch i (policy lag 1) with
  ``--learner-threads``.

    python bench/bench_async.py tuned_examples/frozenlake_noslip_cpu.yaml \
        --modes sync-local,sync-remote-2,async,async-2

Every mode reports its stage times and thread counts. Two bounds judge the
ratio: overlapping two equal stages can at most halve an iteration (2x), and
no schedule on C cores beats the stages' single-thread work divided by C
(``--threads`` is C here), which the output prints as ``async_floor_s``.

``--device-time`` (a simulation) measures the overlap without the stages
competing for cores: the rollout and the update sleep for a set device time
instead of computing, and everything else is the real system (the runner
actors and Ray calls, the trajectories, the sample-batch stage, the freshness
buffer and its lag bound, the learner call with its connector, and the weight
push of the model's real weights through the object store into each runner's
engine). See :func:`device_time_main`.

    python bench/bench_async.py --device-time --quick     # about a minute
    python bench/bench_async.py --device-time             # the full grid
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

MODES = {
    "sync-local": {"num_env_runners": 0, "async_rollouts": False},
    "sync-remote": {"num_env_runners": 1, "async_rollouts": False},
    "sync-remote-2": {"num_env_runners": 2, "async_rollouts": False},
    "async": {"num_env_runners": 1, "async_rollouts": True},
    "async-2": {"num_env_runners": 2, "async_rollouts": True},
}


def run_mode(config, warmup: int, iterations: int) -> dict:
    algo = config.build_algo()
    try:
        for _ in range(warmup):
            algo.train()
        rows = []
        start = time.perf_counter()
        for _ in range(iterations):
            result = algo.train()
            rows.append({**result["timing"], "lag": result["rollout"].get("policy_lag_mean", 0)})
        wall = time.perf_counter() - start
    finally:
        algo.stop()

    def mean(key):
        return round(sum(r[key] for r in rows) / len(rows), 3)

    return {
        "iterations_per_s": round(iterations / wall, 4),
        "seconds_per_iteration": round(wall / iterations, 3),
        **{
            key: mean(key)
            for key in (
                "sample_wait_s",
                "rollout_s",
                "update_s",
                "sync_s",
                "runner_idle_share",
                "learner_idle_share",
                "lag",
            )
        },
    }


# ----- --device-time: each stage's compute replaced by a fixed device time ---------------

#: The Bandit (one turn: one generate call per sample) with the bandit example's batch,
#: P=8 groups x N=8, one optimizer step per update; no collapse information metrics
#: (they run the model), no evaluation; float32 weights on every machine (model_dtype
#: auto would push bfloat16 ones where the CPU computes it natively).
DEVICE_TIME_CONFIG = {
    "env": "ragen/Bandit-v0",
    "llm": "builtin",
    "model_dtype": "float32",
    "env_groups": 8,
    "group_size": 8,
    "max_turns": 1,
    "max_new_tokens": 24,
    "advantage_estimator": "grpo",
    "reward_norm_method": "mean",
    "filter_keep_ratio": 1.0,
    "minibatch_size": 64,
    "collapse_metrics_interval": 0,
    "eval_interval": 0,
    "seed": 0,
}
#: Well-formed Bandit answers (after the prefilled "<think>"); rows alternate arms.
ANSWERS = (
    " I take the steady arm.</think><answer>Phoenix</answer>",
    " I take the risky arm.</think><answer>Dragon</answer>",
)
QWEN_SHAPE = "qwen2.5-0.5b-shape"
_class_ids = iter(range(1_000_000))


def sleeping_classes(rollout_s: float, update_s: float):
    """(runner class, learner class) whose rollout and update sleep instead of computing.

    The runner is the real ``LLMEnvRunner`` (envs, prompts, trajectories, weight
    loading) with its engine wrapped: ``generate`` sleeps ``rollout_s / max_turns``
    per turn and returns well-formed answers; ``load_weights`` is the real engine's
    (``load_state_dict`` into the model). The learner is the real
    ``StarPOTorchLearner`` (connector, minibatches, metrics) whose optimizer steps
    sleep ``update_s`` per update in all instead of running the model; its module
    keeps the real weights, which every push carries. Both log when each call
    began and ended (wall clock, comparable across the processes of one machine).

    Defined in the bench's ``__main__``, the classes travel to the runner actors by
    value; each call makes uniquely named classes, so Ray never reuses an actor
    class of another setting."""
    import torch
    from ray.rllib.core import COMPONENT_RL_MODULE
    from ray.rllib.utils.metrics import WEIGHTS_SEQ_NO

    from ragen_rllib.engines.base import Generation, RolloutEngine
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.learner.starpo_learner import StarPOTorchLearner

    class SleepEngine(RolloutEngine):
        def __init__(self, real, tokenizer, turn_s: float):
            self.real, self.model, self.turn_s = real, real.model, turn_s
            self.eos = tokenizer.eos_token_id
            self.answers = [tokenizer.encode(t, add_special_tokens=False) for t in ANSWERS]
            self.slept = self.load_s = 0.0

        @property
        def policy_version(self) -> int:
            return self.real.policy_version

        def _generate(self, request):
            start = time.perf_counter()
            time.sleep(self.turn_s)
            self.slept += time.perf_counter() - start
            out = []
            for row in range(len(request.prompts)):
                answer = self.answers[(request.seed + row) % len(self.answers)]
                ids = (answer + [self.eos])[: request.params.max_new_tokens]
                out.append(Generation(ids, [-0.7] * len(ids), ids[-1] == self.eos))
            return out

        def load_weights(self, state_dict, version: int) -> None:
            start = time.perf_counter()
            self.real.load_weights(state_dict, version)
            self.load_s += time.perf_counter() - start

        def clear_cache(self) -> None:
            self.real.clear_cache()

    class SleepRunner(LLMEnvRunner):
        def __init__(self, *, config, **kwargs):
            super().__init__(config=config, **kwargs)
            self.engine = SleepEngine(self.engine, self.tokenizer, rollout_s / config.max_turns)
            # (kind, key, began, ended, device seconds or load seconds)
            self.bench_calls: list[tuple] = []

        def sample_groups(self, group_seeds, groups, sample_seed, reset_options=None):
            began, slept = time.time(), self.engine.slept
            trajs = super().sample_groups(group_seeds, groups, sample_seed, reset_options)
            ended = time.time()
            self.bench_calls.append(
                ("sample", int(sample_seed), began, ended, self.engine.slept - slept)
            )
            return trajs

        def set_state(self, state):
            began, load = time.time(), self.engine.load_s
            super().set_state(state)
            ended = time.time()
            if isinstance(state, dict) and COMPONENT_RL_MODULE in state:
                version = int(state.get(WEIGHTS_SEQ_NO, 0))
                self.bench_calls.append(
                    ("weights", version, began, ended, self.engine.load_s - load)
                )
            else:  # RLlib's own per-iteration state broadcast
                self.bench_calls.append(("state", None, began, ended, 0.0))

        def get_state(self, *args, **kwargs):
            began = time.time()
            out = super().get_state(*args, **kwargs)
            self.bench_calls.append(("get_state", None, began, time.time(), 0.0))
            return out

        def bench_log(self) -> list[tuple]:
            return list(self.bench_calls)

    class SleepLearner(StarPOTorchLearner):
        def update(self, *args, **kwargs):
            # One update: its optimizer steps share the update's device time.
            steps = (kwargs.get("minibatches_per_epoch") or 1) * kwargs.get("num_epochs", 1)
            self._bench_step_s = update_s / max(1, steps)
            self.__dict__.setdefault("bench_slept", []).append(0.0)  # seconds, per update
            return super().update(*args, **kwargs)

        def optimizer_step(self, batch, first=False):
            start = time.perf_counter()
            time.sleep(self._bench_step_s)
            self.bench_slept[-1] += time.perf_counter() - start
            for mid in batch:  # the signals the algorithm's collapse watch reads
                for key in ("approx_kl", "gradients_actor_global_norm", "entropy"):
                    self.metrics.log_value((mid, key), 0.0, window=1)
            return {}, {mid: torch.zeros(()) for mid in batch}

    tag = next(_class_ids)
    for cls in (SleepRunner, SleepLearner):
        cls.__name__ = cls.__qualname__ = f"{cls.__name__}{tag}"
    return SleepRunner, SleepLearner


def timed_algorithm_class():
    """StarPO with stopwatches around the driver's parts of an iteration (launching the
    sample, collecting it, the sample-batch stage, the buffer, the learner call, the
    weight push and its parts). The production methods run unchanged; the wrappers
    only read the clock. ``bench_iterations`` holds one dict of seconds per
    ``training_step``; ``bench_dispatch`` when each sample share and weight push was
    sent (wall clock), keyed by the share's sampling seed or the weights' version."""
    import contextlib
    import functools
    from collections import defaultdict

    from ragen_rllib.algorithms.starpo import sampling
    from ragen_rllib.algorithms.starpo.starpo import StarPO

    class TimedStarPO(StarPO):
        def setup(self, config) -> None:
            super().setup(config)
            self.bench_iterations: list[dict] = []
            self.bench_dispatch: dict[str, dict] = {"sample": {}, "weights": {}}
            self.bench_push_bytes = 0
            self._now: dict = defaultdict(float)
            lg, group = self.learner_group, self.env_runner_group
            lg.update = self._stopwatch(lg.update, "update")
            lg.get_state = self._stopwatch(lg.get_state, "push_get_state")
            self._sample_stage = self._stopwatch(self._sample_stage, "sample_stage")
            self._buffer.add = self._stopwatch(self._buffer.add, "buffer")
            self._buffer.sample = self._stopwatch(self._buffer.sample, "buffer")
            send = group.foreach_env_runner_async

            @functools.wraps(send)
            def dispatch(func, *args, tag=None, remote_worker_ids=None, **kwargs):
                with self._clock(f"{tag}_dispatch") as began:
                    made = send(func, *args, tag=tag, remote_worker_ids=remote_worker_ids, **kwargs)
                if tag == "sample":
                    self.bench_dispatch["sample"][func.keywords["sample_seed"]] = began
                elif tag == "weights":
                    self.bench_dispatch["weights"][self._policy_version] = began
                return made

            group.foreach_env_runner_async = dispatch
            # The payload's conversion to NumPy (``to_wire``), timed where the push calls it.
            self._to_wire = sampling.to_wire

            def to_wire(state):
                with self._clock("push_to_wire"):
                    out = self._to_wire(state)
                self.bench_push_bytes = sum(array.nbytes for array, _ in out.values())
                return out

            sampling.to_wire = to_wire

        def cleanup(self) -> None:
            sampling.to_wire = self._to_wire
            super().cleanup()

        @contextlib.contextmanager
        def _clock(self, key: str):
            """Adds the block's seconds to this iteration's ``key`` and logs it as an
            event (key, began, ended; wall clock) for the timeline; yields its start."""
            began, start = time.time(), time.perf_counter()
            try:
                yield began
            finally:
                self._now[key] += time.perf_counter() - start
                self._now.setdefault("events", []).append((key, began, time.time()))

        def _stopwatch(self, fn, key: str):
            @functools.wraps(fn)
            def timed(*args, **kwargs):
                with self._clock(key):
                    return fn(*args, **kwargs)

            return timed

        def training_step(self) -> None:
            self._now = defaultdict(float)
            with self._clock("training_step"):
                super().training_step()
            self.bench_iterations.append(dict(self._now))

        def _launch_sample(self) -> None:
            with self._clock("launch"):
                super()._launch_sample()

        def _collect_sample(self):
            seeds = [share[2] for share in self._request.shares.values()]
            with self._clock("collect") as began:
                out = super()._collect_sample()
            self._now["collect_began"] = began
            self._now["collected_at"] = time.time()
            self._now["collected_seeds"] = seeds
            return out

        def _push_weights(self, worker_ids=None, wait=True) -> None:
            with self._clock("push"):
                super()._push_weights(worker_ids=worker_ids, wait=wait)

        def _await_weight_pushes(self) -> None:
            with self._clock("push_await"):
                super()._await_weight_pushes()

    return TimedStarPO


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def overhead_breakdown(
    its: list[dict],
    walls: list[float],
    slept: list[float],
    calls: list[list[tuple]],
    dispatch,
    since: float,
) -> dict[str, float]:
    """Milliseconds per iteration (the mean over the timed iterations), by part. Driver
    parts: ``its`` (the timed iterations' stopwatches), ``walls`` (each ``train()``
    call), ``slept`` (the learner's device seconds per iteration). Runner parts: each
    runner's ``calls`` that began in the timed window (from ``since``), matched to the
    driver's ``dispatch`` times; a runner-side figure is the mean over the runners'
    calls (they run in parallel)."""

    def ms(x: float) -> float:
        return round(1000 * x, 2)

    push_parts = ("push_get_state", "push_to_wire", "weights_dispatch", "push_await")
    out = {
        # Driver: Algorithm.train() around training_step (RLlib's per-iteration sync of
        # the runners' states, the results), then training_step's own parts.
        "rllib_step_ms": _mean(w - it["training_step"] for w, it in zip(walls, its, strict=True)),
        "launch_ms": _mean(it.get("launch", 0) for it in its),
        "collect_ms": _mean(it.get("collect", 0) for it in its),
        "sample_stage_ms": _mean(it.get("sample_stage", 0) for it in its),
        "buffer_ms": _mean(it.get("buffer", 0) for it in its),
        "learner_call_ms": _mean(it.get("update", 0) - s for it, s in zip(its, slept, strict=True)),
        "push_ms": _mean(it.get("push", 0) for it in its),
        "push_get_state_ms": _mean(it.get("push_get_state", 0) for it in its),
        "push_to_wire_ms": _mean(it.get("push_to_wire", 0) for it in its),
        "push_put_ms": _mean(
            it.get("push", 0) - sum(it.get(k, 0) for k in push_parts) for it in its
        ),
        "push_dispatch_ms": _mean(it.get("weights_dispatch", 0) for it in its),
        "push_await_ms": _mean(it.get("push_await", 0) for it in its),
    }
    named = ("launch", "collect", "sample_stage", "buffer", "update", "push")
    out["driver_other_ms"] = _mean(
        it["training_step"] - sum(it.get(k, 0) for k in named) for it in its
    )
    # Runner side: each call's start measured from when it could start (sent, and the
    # runner's previous call done), its own time, and the trip of a sample back.
    sample_trip, runner_sample, weights_get, weights_unpack, weights_load, state = (
        [] for _ in range(6)
    )
    ends: dict[int, float] = {}
    for runner in calls:
        prev_end = 0.0
        for kind, key, began, ended, inner in runner:
            if began < since:  # before the timed window: it only delays the next call
                if kind == "sample":
                    ends[key] = ended
            elif kind == "sample" and key in dispatch["sample"]:
                sample_trip.append(began - max(dispatch["sample"][key], prev_end))
                runner_sample.append(ended - began - inner)
                ends[key] = ended
            elif kind == "weights" and key in dispatch["weights"]:
                weights_get.append(began - max(dispatch["weights"][key], prev_end))
                weights_unpack.append(ended - began - inner)
                weights_load.append(inner)
            elif kind in ("state", "get_state"):
                state.append(ended - began)
            prev_end = ended
    # A sample's way back: from when it was done and the driver was collecting.
    returns = [
        it["collected_at"] - max(it["collect_began"], *(ends[s] for s in it["collected_seeds"]))
        for it in its
        if "collected_at" in it and all(s in ends for s in it["collected_seeds"])
    ]
    out.update(
        {
            "sample_send_ms": _mean(sample_trip),
            "runner_sample_ms": _mean(runner_sample),
            "sample_return_ms": _mean(returns),
            "weights_get_ms": _mean(weights_get),
            "weights_unpack_ms": _mean(weights_unpack),
            "weights_load_ms": _mean(weights_load),
            "runner_state_calls_ms": sum(state) / max(1, len(calls)) / max(1, len(its)),
        }
    )
    return {k: ms(v) for k, v in out.items()}


def run_device_time(config, warmup: int, iterations: int, rollout_s: float, update_s: float):
    """One mode of ``config`` with sleeping stages: seconds per iteration, the overhead
    breakdown, the stage timings RLlib logs, and the policy lag."""
    algo = config.build_algo()
    try:
        for _ in range(warmup):
            algo.train()
        walls, spans, rows = [], [], []
        began = time.time()
        start = time.perf_counter()
        for _ in range(iterations):
            t0, w0 = time.perf_counter(), time.time()
            result = algo.train()
            walls.append(time.perf_counter() - t0)
            spans.append((w0, time.time()))
            rows.append(
                {
                    **result["timing"],
                    "lag": result["rollout"].get("policy_lag_mean", 0),
                    "dropped": result["rollout"].get("dropped_stale_lifetime", 0),
                    "weights_load_s": result.get("env_runners", {}).get("weights_load_s", 0),
                    "token_lag": result["learners"]["default_policy"].get("token_lag_mean"),
                    "mid": result.get("env_runners", {}).get("weights_loaded_mid_sample", 0),
                }
            )
        wall = time.perf_counter() - start
        its = algo.bench_iterations[-iterations:]
        slept = algo.learner_group._learner.bench_slept[-iterations:]
        logs = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.bench_log(), local_env_runner=False
        )
        calls = [list(log) for log in logs]
        push_bytes = algo.bench_push_bytes
        dispatch = algo.bench_dispatch
    finally:
        algo.stop()
        del algo
        gc.collect()  # the stopped algorithm's objects, before the next one is timed
    asynchronous = config.async_rollouts
    device = max(rollout_s, update_s) if asynchronous else rollout_s + update_s
    per_it = wall / iterations

    def mean_s(key: str) -> float:  # a runner metric is NaN in an iteration without it
        return round(_mean(r[key] for r in rows if r[key] == r[key]), 4)

    return {
        "seconds_per_iteration": round(per_it, 4),
        "iterations_per_s": round(iterations / wall, 4),
        "iteration_walls_s": [round(w, 3) for w in walls],
        "device_s_per_iteration": device,
        "overhead_ms": round(1000 * (per_it - device), 2),
        "parts_ms": overhead_breakdown(its, walls, slept, calls, dispatch, since=began),
        "timing_s": {
            key: mean_s(key)
            for key in ("sample_wait_s", "rollout_s", "update_s", "sync_s", "weights_load_s")
        },
        "policy_lag_mean": _mean(r["lag"] for r in rows),
        # Per token (partial rollouts lower it below the trajectories' oldest-token lag).
        "token_lag_mean": round(
            _mean(r["token_lag"] for r in rows if r["token_lag"] is not None), 4
        ),
        "weights_loaded_mid_sample": rows[-1]["mid"] if rows[-1]["mid"] == rows[-1]["mid"] else 0,
        "dropped_stale": rows[-1]["dropped"],
        "push_bytes": push_bytes,
        "timeline": timeline(its[-1]["events"], calls, *spans[-1]),
    }


def timeline(events: list[tuple], calls: list[list[tuple]], began: float, ended: float):
    """The last timed ``train()`` call as [who, what, start ms, end ms] rows (from the
    call's start): the driver's timed parts and each runner's calls that overlap it."""
    rows = [("driver", key, t0, t1) for key, t0, t1 in events]
    for i, runner in enumerate(calls):
        rows += [(f"runner{i + 1}", kind, t0, t1) for kind, _, t0, t1, _ in runner]
    rows = [
        [who, what, round(1000 * (t0 - began), 1), round(1000 * (t1 - began), 1)]
        for who, what, t0, t1 in sorted(rows, key=lambda r: r[2])
        if t1 >= began and t0 <= ended
    ]
    return [["driver", "train", 0.0, round(1000 * (ended - began), 1)], *rows]


def shaped_model_dir(root: str) -> str:
    """A Qwen2.5-0.5B-shaped model with random weights (fp32, as the learner keeps
    them) and the built-in tokenizer, saved under ``root`` (built as in
    bench_learner_memory.py)."""
    from bench_learner_memory import build_model
    from transformers import AutoTokenizer

    from ragen_rllib.models.resolve import resolve_model

    path = os.path.join(root, QWEN_SHAPE)
    if not os.path.exists(os.path.join(path, "config.json")):
        build_model(path)
        AutoTokenizer.from_pretrained(resolve_model("builtin")).save_pretrained(path)
    return path


def device_time_main(args) -> int:
    """Sync against async with sleeping stages (a simulation; see the module docstring).

    Settings: every stage ratio of ``--ratios`` (rollout:update, in units of
    ``--stage-s`` seconds) with the first model and runner count, and the equal
    stages with every model of ``--models`` and runner count of ``--runners``. Each
    setting runs synchronously and asynchronously with the same runners. A runner's
    rollout sleeps the rollout time for its share (its own device), so the rollout
    stage lasts as long with any number of runners. Prints one JSON line per run,
    a table, and the whole figures as JSON (``--json`` also writes them to a file).
    """
    import tempfile

    import ray

    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    if args.quick:
        args.stage_s, args.ratios, args.runners, args.models = 0.3, "1:1", "1", "builtin"
        args.warmup, args.iterations = 1, 4
    ratios = args.ratios.split(",")
    runners = [int(n) for n in args.runners.split(",")]
    models = args.models.split(",")
    settings = [(models[0], runners[0], r) for r in ratios]
    settings += [(m, n, "1:1") for m in models for n in runners if (m, n, "1:1") not in settings]
    overrides = json.loads(args.config) if args.config else {}
    # Logical CPUs: the runner actors sleep, so more of them than cores is the point.
    ray.init(
        address="local",  # a Ray instance of its own, even beside a running cluster
        num_cpus=max(os.cpu_count() or 1, max(runners)),
        include_dashboard=False,
        log_to_driver=False,
    )
    figures: dict = {
        "simulation": "rollout and update sleep a set device time; the rest is the real system",
        "command": "python " + " ".join([os.path.relpath(__file__)] + sys.argv[1:]),
        "cpus": os.cpu_count(),
        "stage_s": args.stage_s,
        "warmup": args.warmup,
        "iterations": args.iterations,
        "config": {**DEVICE_TIME_CONFIG, **overrides},
        "runs": [],
    }
    # The shaped model's folder (2 GB) is removed at the end, whatever happens.
    root_dir = tempfile.TemporaryDirectory(prefix="bench-async-")
    root = root_dir.name
    try:
        for model, n, ratio in settings:
            r_units, u_units = (float(x) for x in ratio.split(":"))
            rollout_s, update_s = r_units * args.stage_s, u_units * args.stage_s
            llm = shaped_model_dir(root) if model == QWEN_SHAPE else model
            row = {"model": model, "runners": n, "ratio": ratio}
            row.update({"rollout_s": rollout_s, "update_s": update_s})
            for mode in ("sync", "async", "async-partial") if args.partial else ("sync", "async"):
                user = {**DEVICE_TIME_CONFIG, "llm": llm, **overrides}
                user.update({"num_env_runners": n, "async_rollouts": mode != "sync"})
                user["partial_rollouts"] = mode == "async-partial"
                config = StarPOConfig.from_user_dict(user)
                runner_cls, learner_cls = sleeping_classes(rollout_s, update_s)
                config.env_runners(env_runner_cls=runner_cls)
                config.learners(learner_class=learner_cls)
                config.algo_class = timed_algorithm_class()
                if args.rllib_state_sync != "default":
                    # RLlib's per-iteration get_state/set_state round trip to every runner.
                    config._dont_auto_sync_env_runner_states = args.rllib_state_sync == "off"
                out = run_device_time(config, args.warmup, args.iterations, rollout_s, update_s)
                row[mode] = out
                print(
                    json.dumps(
                        {**{k: row[k] for k in ("model", "runners", "ratio")}, "mode": mode, **out}
                    ),
                    flush=True,
                )
            row["async_vs_sync"] = round(
                row["sync"]["seconds_per_iteration"] / row["async"]["seconds_per_iteration"], 3
            )
            row["ideal"] = round((rollout_s + update_s) / max(rollout_s, update_s), 3)
            if args.partial:
                row["partial_vs_async"] = round(
                    row["async"]["seconds_per_iteration"]
                    / row["async-partial"]["seconds_per_iteration"],
                    3,
                )
            row["push_mib"] = round(row["sync"]["push_bytes"] / 2**20, 1)
            figures["runs"].append(row)
    finally:
        ray.shutdown()
        root_dir.cleanup()
    print(device_time_table(figures))
    print(json.dumps(figures, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2)
    return 0


def device_time_table(figures: dict) -> str:
    """The runs as a Markdown table (seconds per iteration, the ratio, the overhead)."""
    lines = [
        f"device-time simulation, stage unit {figures['stage_s']} s: {figures['command']}",
        "| model (push MiB) | runners | rollout:update | sync s/it | async s/it | async/sync "
        "| ideal | overhead sync / async ms | lag async |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in figures["runs"]:
        s, a = r["sync"], r["async"]
        lines.append(
            f"| {r['model']} ({r['push_mib']}) | {r['runners']} | {r['ratio']} "
            f"| {s['seconds_per_iteration']:.3f} | {a['seconds_per_iteration']:.3f} "
            f"| {r['async_vs_sync']:.2f}x | {r['ideal']:.1f}x "
            f"| {s['overhead_ms']:.0f} / {a['overhead_ms']:.0f} | {a['policy_lag_mean']:.2f} |"
        )
    if any("async-partial" in r for r in figures["runs"]):
        lines += [
            "",
            "| model | runners | rollout:update | async s/it | partial s/it | partial/async "
            "| token lag async / partial | loads mid-sample |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in figures["runs"]:
            a, p = r["async"], r["async-partial"]
            lines.append(
                f"| {r['model']} | {r['runners']} | {r['ratio']} "
                f"| {a['seconds_per_iteration']:.3f} | {p['seconds_per_iteration']:.3f} "
                f"| {r['partial_vs_async']:.2f}x "
                f"| {a['token_lag_mean']:.2f} / {p['token_lag_mean']:.2f} "
                f"| {p['weights_loaded_mid_sample']} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "file",
        nargs="?",
        help="experiment YAML (its first experiment is run); not with --device-time",
    )
    parser.add_argument("--config", default=None, help="JSON object merged into the config")
    parser.add_argument("--modes", default="sync-local,sync-remote-2,async,async-2")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument(
        "--learner-threads",
        type=int,
        default=1,
        help="torch threads of the driver's learner beside a runner actor (which has 1)",
    )
    device = parser.add_argument_group("--device-time (a simulation: the stages sleep)")
    device.add_argument("--device-time", action="store_true", help="see device_time_main")
    device.add_argument("--quick", action="store_true", help="one setting, 0.3 s stages")
    device.add_argument("--stage-s", type=float, default=0.5, help="seconds of one stage unit")
    device.add_argument("--ratios", default="1:1,1:2,2:1", help="rollout:update, in units")
    device.add_argument("--runners", default="1,2,4", help="runner actors (equal stages)")
    device.add_argument("--models", default=f"builtin,{QWEN_SHAPE}")
    device.add_argument(
        "--rllib-state-sync",
        choices=("default", "on", "off"),
        default="default",
        help="RLlib's sync of the runners' states after every iteration (default: as the "
        "config has it)",
    )
    device.add_argument(
        "--partial",
        action="store_true",
        help="also run async with partial_rollouts (same lag bound): give a multi-turn env "
        'with --config, e.g. \'{"env": "ragen/FrozenLakeNoSlip-v0", "max_turns": 4}\'',
    )
    device.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    if args.device_time:
        return device_time_main(args)
    if args.file is None:
        parser.error("an experiment file is needed (or --device-time)")

    import ray
    import torch

    from ragen_rllib.cli.experiments import build_config, load_experiments

    name, exp = next(iter(load_experiments(args.file).items()))
    overrides = json.loads(args.config) if args.config else {}
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    figures: dict = {"experiment": name, "cpus": os.cpu_count(), "modes": {}}
    try:
        for mode in args.modes.split(","):
            config, _ = build_config(exp, {**overrides, **MODES[mode]})
            config.eval_interval = 0
            # The learner has the cores to itself unless runner actors sample beside it.
            overlapped = MODES[mode]["async_rollouts"]
            threads = args.learner_threads if overlapped else args.threads
            torch.set_num_threads(threads)
            out = run_mode(config, args.warmup, args.iterations)
            out["learner_threads"] = threads
            out["runner_threads"] = args.threads if mode == "sync-local" else 1
            out["runner_actors"] = MODES[mode]["num_env_runners"]
            figures["modes"][mode] = out
            print(mode, json.dumps(out), flush=True)
    finally:
        ray.shutdown()
    modes = figures["modes"]
    sync = {m: v for m, v in modes.items() if not MODES[m]["async_rollouts"]}
    if sync:
        best = max(sync, key=lambda m: sync[m]["iterations_per_s"])
        figures["best_sync"] = best
        figures["throughput_vs_best_sync"] = {
            m: round(v["iterations_per_s"] / sync[best]["iterations_per_s"], 2)
            for m, v in modes.items()
        }
    one_thread = [v for v in modes.values() if v["runner_threads"] == v["learner_threads"] == 1]
    if one_thread:
        # Rollout and update work at one thread each (an actor samples its share of the
        # groups, so its busy time times the actors is the whole batch's).
        work = min(v["rollout_s"] * v["runner_actors"] + v["update_s"] for v in one_thread)
        figures["async_floor_s"] = round(work / args.threads, 3)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
