"""Environment faults: an env that raises loses its group for the update, is logged and
counted; more than `max_env_error_share` of a batch failing stops the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import private_env, run_script, tiny_config, tiny_dict
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.connectors.sample_batch import EnvErrorBudgetExceeded, build_sample_pipeline
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.env_runner.metrics import rollout_metrics

USER_ENVS = Path(__file__).resolve().parent / "user_envs"


@pytest.fixture(scope="module", autouse=True)
def user_envs_importable():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(USER_ENVS))
        yield


#: The user env that raises for the seeds in its env_config, in 3 groups of 2.
FLAKY = {
    "env": "FlakySayTheWord-v0",
    "env_module": "my_text_envs",
    "env_groups": 3,
    "max_new_tokens": 8,
    "minibatch_size": 2,
}


def flaky_config(**overrides):
    return tiny_config(**{**FLAKY, **overrides})


@pytest.fixture(scope="module")
def group_seeds():
    """The initial-state seeds of the first sample() call, one per group."""
    seeds, _ = LLMEnvRunner(config=flaky_config(), worker_index=0).training_group_seeds(0)
    return seeds


def failing_batch(seeds, **overrides):
    """Group 0 fails in step(), group 2 in reset(); group 1 is healthy."""
    env_config = {"fail_step_seeds": [seeds[0]], "fail_reset_seeds": [seeds[2]]}
    cfg = flaky_config(env_config=env_config, **overrides)
    return cfg, LLMEnvRunner(config=cfg, worker_index=0).sample()


def test_failed_groups_are_dropped_and_counted(group_seeds):
    cfg, trajs = failing_batch(group_seeds, max_env_error_share=0.7)
    assert [t.end_reason == "env_error" for t in trajs] == [True, True, False, False, True, True]
    assert trajs[0].error == f"step(): ValueError: step failed for seed {group_seeds[0]}"
    assert trajs[5].error == f"reset(): RuntimeError: reset failed for seed {group_seeds[2]}"
    stats = rollout_metrics(trajs)
    assert stats["env_errors"] == 4 and stats["num_trajectories"] == 2
    assert stats["end/env_error"] == pytest.approx(4 / 6)

    metrics = MetricsLogger()
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs, metrics=metrics)
    assert [t.group for t in trajs] == [1, 1]  # only the healthy group is trained on
    assert metrics.peek(("rollout", "env_error_groups_dropped")) == 2


def test_a_non_finite_reward_is_the_envs_error(group_seeds):
    """A NaN reward ends its trajectory as an env error, so its group leaves the
    update and nothing downstream (a filter's ranking, a running baseline) sees it."""
    cfg = flaky_config(env_config={"nan_reward_seeds": [group_seeds[1]]}, max_env_error_share=0.5)
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    assert [t.end_reason == "env_error" for t in trajs] == [False, False, True, True, False, False]
    assert trajs[2].error == (
        "step(): ValueError: the env returned a reward of nan: it must be a finite number"
    )
    metrics = MetricsLogger()
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs, metrics=metrics)
    assert [t.group for t in trajs] == [0, 0, 2, 2]
    assert metrics.peek(("rollout", "env_error_groups_dropped")) == 1


def test_too_many_env_errors_stop_the_run_with_a_clear_error(group_seeds):
    cfg, trajs = failing_batch(group_seeds, max_env_error_share=0.5)
    with pytest.raises(EnvErrorBudgetExceeded) as err:
        build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=list(trajs))
    message = str(err.value)
    assert "4 of 6 trajectories (67%)" in message and "max_env_error_share=0.5" in message
    assert f"'FlakySayTheWord-v0', seed {group_seeds[0]}: step(): ValueError" in message
    # A budget above the failed share lets the batch through, minus the failed groups.
    cfg, trajs = failing_batch(group_seeds, max_env_error_share=0.7)
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs)
    assert len(trajs) == 2


def test_a_first_prompt_past_the_context_bound_ends_its_trajectory_and_drops_its_group(
    group_seeds,
):
    """A seed whose first prompt leaves no room for an answer: its trajectories end as
    context_overflow with no turn, count there, and their group leaves the update."""
    cfg = flaky_config(env_config={"long_seeds": [group_seeds[1]]}, max_context_tokens=256)
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    ends = [(t.end_reason, t.num_turns) for t in trajs]
    assert ends[2:4] == [("context_overflow", 0)] * 2 and ends[0][1] == 1 == ends[4][1]
    assert "max_context_tokens=256" in trajs[2].error
    stats = rollout_metrics(trajs)
    assert stats["end/context_overflow"] == pytest.approx(2 / 6)
    assert stats["num_trajectories"] == 4  # no outcome to average for the two
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs)
    assert [t.group for t in trajs] == [0, 0, 2, 2]


def test_the_context_bound_is_checked_against_first_prompts_and_the_model_before_ray():
    cfg = flaky_config(env_config={"long_seeds": [0]}, max_context_tokens=256)
    with pytest.raises(ValueError) as err:
        cfg.check()
    message = str(err.value)
    assert message.startswith("config max_context_tokens=256 is too small: the first prompt")
    assert "FlakySayTheWord-v0 (seed 0)" in message and "\n" not in message
    with pytest.raises(ValueError, match=r"max_context_tokens=8192 .* max_position_embeddings="):
        flaky_config(max_context_tokens=8192).check()


@pytest.mark.slow
def test_training_goes_on_past_env_errors_and_counts_them(group_seeds, tmp_path):
    """Through the algorithm (Ray, the learner): iteration 1 loses groups 0 and 2 and
    still updates; the lifetime counter sums the errors; a tight budget stops the run;
    a batch with no group left skips the update."""
    env_config = {"fail_step_seeds": [group_seeds[0]], "fail_reset_seeds": [group_seeds[2]]}
    base = tiny_dict(**FLAKY, max_env_error_share=0.7, env_config=env_config)
    script = f"""
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
base = {base!r}
algo = StarPOConfig.from_user_dict(base).build_algo()
rows = []
for _ in range(2):
    r = algo.train()
    rows.append({{
        "env_errors": r["rollout"]["env_errors"],
        "dropped": r["rollout"]["env_error_groups_dropped"],
        "trained": r["learners"]["default_policy"]["num_module_steps_trained"],
        "lifetime_errors": r["counters"]["num_env_errors_lifetime"],
    }})
algo.stop()
algo = StarPOConfig.from_user_dict({{**base, "max_env_error_share": 0.25}}).build_algo()
try:
    algo.train()
    error = None
except Exception as err:
    error = str(err)
every = {{**base, "max_env_error_share": 1.0,
          "env_config": {{"fail_reset_seeds": {group_seeds}}}}}
algo = StarPOConfig.from_user_dict(every).build_algo()
r = algo.train()
empty = {{"env_errors": r["rollout"]["env_errors"], "empty": r["rollout"]["empty_batches"],
          "trained": r.get("learners", {{}}).get("default_policy", {{}}).get(
              "num_module_steps_trained", 0)}}
print(json.dumps({{"rows": rows, "error": error, "empty": empty}}, default=float))
"""
    out = run_script(
        script, tmp_path, timeout=900, env=private_env(tmp_path, PYTHONPATH=str(USER_ENVS))
    )
    first, second = out["rows"]
    assert first == {"env_errors": 4, "dropped": 2, "trained": 2, "lifetime_errors": 4}
    assert second["lifetime_errors"] == 4 + second["env_errors"]
    assert "max_env_error_share=0.25" in out["error"] and "FlakySayTheWord-v0" in out["error"]
    # Every group failed, under a budget of 1.0: the iteration ends without an update.
    assert out["empty"] == {"env_errors": 6, "empty": 1, "trained": 0}
