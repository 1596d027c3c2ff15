"""Agent programs as the rollout (`agent`, `agent_tasks`): the env runner calls the
user's function per trajectory behind its chat completions gateway, and what the
agent generated trains as any trajectory does. The agents under test
(tests/user_agents/plain_agents.py) import nothing of this project."""

from __future__ import annotations

import json
import multiprocessing
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    absolute_imports,
    learner_logp_gap,
    run_script,
    tiny_config,
    tiny_dict,
    train_iterations,
)
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.agents.programs import (
    RewardOutOfBounds,
    agent_outcome,
    load_callable,
    load_tasks,
)
from ragen_rllib.connectors.sample_batch import build_sample_pipeline
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.records.trajectory import Trajectory

HERE = Path(__file__).resolve().parent
AGENTS = HERE / "user_agents" / "plain_agents.py"
ROOT = HERE.parent
#: The timeout of the tests whose batches mix healthy and hung agents: a healthy call
#: (one short answer of the built-in model) takes well under a second even on a busy
#: machine, and a hung one sleeps for an hour, so neither can pass for the other.
AGENT_TIMEOUT_S = 10


def tasks_file(tmp_path: Path, *records: dict) -> str:
    text = "".join(json.dumps(r) + "\n" for r in records)
    path = tmp_path / f"tasks-{abs(hash(text))}.jsonl"
    path.write_text(text)
    return str(path)


def agent_config(tmp_path: Path, *records: dict, **overrides):
    return tiny_config(
        agent=f"{AGENTS}:run",
        agent_tasks=tasks_file(tmp_path, *records),
        **{"max_new_tokens": 16, "max_turns": 5, **overrides},  # the agent decides turns
    )


def play(cfg, seeds: list[int]):
    """The runner, and one trajectory per seed (the task ``seed % len(tasks)``)."""
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    trajs = runner.run_episodes(seeds, list(seeds), params, sample_seed=0)  # a group a seed
    return runner, trajs


# ----- the contract, unit by unit ------------------------------------------------------
def test_an_agents_return_value_becomes_turn_rewards():
    assert agent_outcome(1.0, 3) == ([0.0, 0.0, 1.0], True)
    assert agent_outcome(0, 1) == ([0.0], False)
    out = agent_outcome({"reward": 1.0, "turn_rewards": [0.5, -0.1], "success": False}, 2)
    assert out == ([0.5, 0.9], False)
    # numpy's scalars are numbers and bools too
    out = agent_outcome(
        {"reward": np.float32(0.5), "turn_rewards": [np.int64(1)], "success": np.bool_(True)}, 1
    )
    assert out == ([1.5], True) and type(out[1]) is bool
    for bad, says in [
        ("great", "not a finite number"),
        (float("nan"), "not a finite number"),
        (True, "not a finite number"),
        ({"reward": 1, "score": 2}, "unknown keys ['score']"),
        ({"turn_rewards": [1.0]}, "1 turn_rewards for 2 model calls"),
        ({"turn_rewards": ["a", 1]}, "list of finite numbers"),
        ({"reward": 1, "success": "yes"}, "not a bool"),
        (10**400, "not a finite number"),  # too large for a float
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            agent_outcome(bad, 2)
    # Finite but beyond the bound (a sum too: 2 x 6e5 > 1e6), refused apart.
    for bad in (1e308, {"reward": 6e5, "turn_rewards": [6e5, 0.0]}, -2e6):
        with pytest.raises(RewardOutOfBounds, match="agent_max_abs_reward=1e"):
            agent_outcome(bad, 2, max_abs=1e6)
    assert agent_outcome(1e6, 1, max_abs=1e6) == ([1e6], True)


def test_an_agent_that_raised_after_an_engine_failure_is_counted_as_the_engines():
    from ragen_rllib.agents.calls import _Call
    from ragen_rllib.agents.outcomes import ended_by

    call = _Call(None, "", "", None)
    call.error = "InternalServerError: the engine failed"
    traj = Trajectory(env_id="agent", seed=0, group=0)
    assert ended_by(traj, call, 1, 10.0, engine_failures=1) == "engine_failures"
    assert "after 1 engine failure" in traj.error
    traj = Trajectory(env_id="agent", seed=0, group=0)
    assert ended_by(traj, call, 1, 10.0) == "agent_errors"


def test_agent_specs_load_or_name_the_key(tmp_path):
    assert load_callable(f"{AGENTS}:tasks", "agent")("eval")[0]["word"] == "left"
    assert load_callable("json:dumps", "agent") is json.dumps
    for spec, says in [
        ("no_colon", "must be 'module:function'"),
        ("a:b:c", "must be 'module:function'"),
        ("no_such_module_here:run", "importing 'no_such_module_here' failed"),
        (f"{tmp_path}/missing.py:run", "importing .* failed: FileNotFoundError"),
        ("json:no_function", "has no function 'no_function'"),
    ]:
        with pytest.raises(ValueError, match=f"config agent=.* is invalid: .*{says}"):
            load_callable(spec, "agent")
    path = tasks_file(tmp_path, {"q": 1}, {"q": 2, "split": "eval"}, {"q": 3, "split": "train"})
    assert load_tasks(path, "train") == [{"q": 1}, {"q": 3, "split": "train"}]
    assert load_tasks(path, "eval") == [{"q": 2, "split": "eval"}]
    with pytest.raises(ValueError, match="gives no 'eval' tasks"):
        load_tasks(tasks_file(tmp_path, {"q": 1}), "eval")
    with pytest.raises(ValueError, match="agent_tasks=.*JSONDecodeError"):
        (tmp_path / "bad.jsonl").write_text("{not json\n")
        load_tasks(str(tmp_path / "bad.jsonl"), "train")


def test_the_config_checks_agent_and_tasks_together(tmp_path, monkeypatch):
    tasks = tasks_file(tmp_path, {"mode": "talk", "word": "up"}, {"split": "eval", "word": "x"})
    with pytest.raises(ValueError, match="config agent_tasks is missing: agent is set"):
        tiny_config(agent=f"{AGENTS}:run", max_turns=5).check_values()
    with pytest.raises(ValueError, match="config agent is missing: agent_tasks is set"):
        tiny_config(agent="", agent_tasks=tasks, max_turns=5).check_values()
    for key, value in [("max_turns", 3), ("context_window", 0), ("prefill", "")]:
        with pytest.raises(ValueError, match=f"config {key}=.* is invalid with agent"):
            with_agent = {"agent": f"{AGENTS}:run", "agent_tasks": tasks, "max_turns": 5}
            tiny_config(**{**with_agent, key: value}).check_values()
    with pytest.raises(ValueError, match="config agent_gateway_host='::1' is invalid"):
        tiny_config(agent_gateway_host="::1").check_values()
    with pytest.raises(ValueError, match="config agent_tasks=.* no 'eval' tasks"):
        tiny_config(
            agent=f"{AGENTS}:run", agent_tasks=tasks_file(tmp_path, {"a": 1}), max_turns=5
        ).check_values()
    with pytest.raises(ValueError, match="config curriculum is invalid with agent"):
        tiny_config(
            agent=f"{AGENTS}:run",
            agent_tasks=tasks,
            curriculum=[{"from_iteration": 0, "reset_options": {}}],
            max_turns=5,
        ).check_values()
    with pytest.raises(
        ValueError,
        match=r"config agent_timeout_s=10000000000.0 is invalid: .* in \(0, 86400\]",
    ):
        tiny_config(agent_timeout_s=1e10).check_values()
    with pytest.raises(ValueError, match="config agent_timeout_s=0 is invalid"):
        tiny_config(agent_timeout_s=0).check_values()
    # A file path is made absolute where the run starts (runners may start elsewhere).
    monkeypatch.chdir(AGENTS.parent)
    cfg = tiny_config(agent="plain_agents.py:run", agent_tasks=tasks, max_turns=5)
    cfg.check_values()
    assert cfg.agent == f"{AGENTS}:run"


# ----- through the env runner ------------------------------------------------------------
def test_agents_play_the_batch_and_their_answers_train_token_in_token_out(tmp_path):
    """openai, async openai and raw HTTP agents; N=2 per group on one task; turns are
    completions, the agent's rewards land on them, and the learner's log-probs of
    the recorded ids equal the engine's."""
    cfg = agent_config(
        tmp_path,
        {"mode": "talk", "word": "left", "turns": 2},
        {"mode": "async", "word": "left"},
        {"mode": "http", "word": "up"},
        {"split": "eval", "mode": "talk", "word": "up"},
    )
    runner, trajs = play(cfg, [0, 0, 1, 1, 2, 2])
    assert [t.end_reason for t in trajs] == ["terminated"] * 6, [t.error for t in trajs]
    assert [t.num_turns for t in trajs] == [2, 2, 1, 1, 1, 1]
    for t in trajs[:2]:  # the talk agent: a 0.5 bonus per answer block, 1 for the word
        bonus = [0.5 if "<answer>" in a else 0.0 for a in t.answers]
        assert t.turn_rewards == [bonus[0], bonus[1] + float("left" in t.answers[1])]
        assert len(t.segments) == 1  # each request extended the last: one sequence
    assert all(t.env_id == cfg.agent and t.env_name == "run" for t in trajs)
    gap, tokens, _ = learner_logp_gap(cfg, trajs)
    assert gap <= 1e-4 and tokens == sum(t.response_tokens for t in trajs)
    metrics = runner.get_metrics()
    assert metrics["agents"]["agent_errors"] == 0 and metrics["generated_tokens"] == tokens
    # The second turn of a conversation reused the first's keys and values.
    assert metrics["prompt_tokens_reused"] > 0
    runner.stop()


def test_an_agent_that_rewrites_its_history_gets_a_new_segment(tmp_path):
    """Request 3 drops an answer: it opens a second sequence with its own context;
    every answer stays exactly as sampled (its ids decode to what the agent read)."""
    cfg = agent_config(tmp_path, {"mode": "edit", "word": "up"}, {"split": "eval", "word": "up"})
    runner, (traj,) = play(cfg, [0])
    assert traj.end_reason == "terminated" and traj.num_turns == 3
    assert len(traj.segments) == 2
    assert [span[0] for span in traj.turn_spans] == [0, 0, 1]
    for turn, answer in enumerate(traj.answers):
        assert runner.tokenizer.decode(traj.turn_ids(turn), skip_special_tokens=True) == answer
    gap, _, _ = learner_logp_gap(cfg, [traj])
    assert gap <= 1e-4
    runner.stop()


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_failing_agents_drop_their_groups_and_are_counted(tmp_path, isolation):
    cfg = agent_config(
        tmp_path,
        {"mode": "talk", "word": "up", "turns": 1},
        {"mode": "raise"},
        {"mode": "hang", "seconds": 3600},
        {"mode": "silent"},
        {"mode": "bad", "word": "up"},
        {"split": "eval", "word": "up"},
        agent_timeout_s=AGENT_TIMEOUT_S,
        max_env_error_share=1.0,
        agent_isolation=isolation,
    )
    runner, trajs = play(cfg, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
    reasons = [t.end_reason for t in trajs]
    assert reasons == ["terminated"] * 2 + ["env_error"] * 8
    assert trajs[2].error == "agent raised RuntimeError: the agent's own bug"
    assert trajs[4].error == f"agent: no return within agent_timeout_s={AGENT_TIMEOUT_S}"
    assert "without a chat completions request" in trajs[6].error
    assert trajs[8].error.startswith("agent returned 'great': reward 'great' is not a finite")
    counts = runner.get_metrics()["agents"]
    assert (counts["agent_errors"], counts["agent_timeouts"], counts["agent_no_model_call"]) == (
        4,
        2,
        2,
    )
    if isolation == "process":  # the two hung agents' processes were killed at the timeout
        assert counts["agents_killed"] == 2 and counts["hung_threads"] == 0
        assert multiprocessing.active_children() == []
    else:  # their threads sleep on: counted, not stopped
        assert counts["agents_killed"] == 0 and counts["hung_threads"] == 2
    metrics = MetricsLogger()
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs, metrics=metrics)
    assert [t.end_reason for t in trajs] == ["terminated"] * 2  # only group 0 is trained
    assert metrics.peek(("rollout", "env_error_groups_dropped")) == 4
    runner.stop()


_SLOW_SERVER_SCRIPT = """
import json, subprocess, sys
sys.path.insert(0, folder)
from ragen_rllib.agents import calls
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

# The forkserver's start takes 12 s (a module it preloads sleeps at import),
# longer than the agents' timeout, and a process per core spins beside the batch.
calls.FORKSERVER_PRELOAD = (*calls.FORKSERVER_PRELOAD, "slow_start")
hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
try:
    cfg = StarPOConfig.from_user_dict(config)
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    trajs = runner.run_episodes([0, 0, 1], [0, 0, 1], params, sample_seed=0)
    out = {"reasons": [t.end_reason for t in trajs], "errors": [t.error for t in trajs],
           "agents": runner.get_metrics()["agents"]}
    runner.stop()
finally:
    for hog in hogs:
        hog.kill()
print(json.dumps(out, default=float))
"""


def test_a_slow_forkserver_start_costs_no_healthy_agent_its_time(tmp_path):
    """The first process-mode batch of a fresh runner starts the forkserver, here
    slower than agent_timeout_s, on a machine whose cores are busy: the healthy
    agents' clock starts after it, so they answer; the hung one is still killed at
    its timeout."""
    (tmp_path / "slow_start.py").write_text("import time\ntime.sleep(12)\n")
    config = tiny_dict(
        agent=f"{AGENTS}:run",
        agent_tasks=tasks_file(tmp_path, {"mode": "talk", "word": "up", "turns": 1},
                               {"mode": "hang", "seconds": 3600}, {"split": "eval"}),
        max_new_tokens=16, max_turns=5, agent_timeout_s=10, max_env_error_share=1.0,
        agent_isolation="process",
    )  # fmt: skip
    out = run_script(
        _SLOW_SERVER_SCRIPT, tmp_path, define={"config": config, "folder": str(tmp_path)},
        timeout=600,
    )  # fmt: skip
    assert out["reasons"] == ["terminated", "terminated", "env_error"], out["errors"]
    assert out["errors"][2] == "agent: no return within agent_timeout_s=10"
    assert out["agents"]["agents_killed"] == 1 and out["agents"]["agent_timeouts"] == 1


def test_a_forkserver_stuck_in_its_imports_is_an_error_at_the_bound(tmp_path):
    """A forkserver whose start never ends (a module it preloads hangs) is refused at
    ready()'s bound with an error that says so, not waited for without end."""
    (tmp_path / "stuck_start.py").write_text("import time\ntime.sleep(30)\n")
    script = """
import json, sys, time
sys.path.insert(0, folder)
from ragen_rllib.agents import calls
calls.FORKSERVER_PRELOAD = (*calls.FORKSERVER_PRELOAD, "stuck_start")
start = time.monotonic()
try:
    calls._ProcessCall.ready(timeout=3)
    out = {"error": None}
except RuntimeError as err:
    out = {"error": str(err)}
out["seconds"] = time.monotonic() - start
print(json.dumps(out))
"""
    out = run_script(script, tmp_path, define={"folder": str(tmp_path)}, timeout=300)
    assert out["error"] is not None and "no process forked within 3 s" in out["error"]
    assert 3 <= out["seconds"] < 30  # at the bound, not when the import ends


def test_hung_agents_in_processes_leave_no_thread_or_descriptor_behind(tmp_path):
    """agent_isolation: process over three batches, each with two agents that hang past
    their timeout: the runner's threads and open descriptors after the third batch are
    those after the first, and no agent process is left."""
    cfg = agent_config(
        tmp_path, {"mode": "talk", "word": "up", "turns": 1}, {"mode": "hang", "seconds": 3600},
        {"split": "eval", "word": "up"}, agent_timeout_s=AGENT_TIMEOUT_S,
        max_env_error_share=1.0, agent_isolation="process",
    )  # fmt: skip
    runner, _ = play(cfg, [0, 0, 1, 1])

    def agent_threads() -> int:  # thread-mode calls (other tests' hung ones may still run)
        return sum(t.name == "agent" for t in threading.enumerate())

    threads, fds, agents = (
        threading.active_count(),
        len(os.listdir("/proc/self/fd")),
        agent_threads(),
    )
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    for _ in range(2):
        trajs = runner.run_episodes([0, 0, 1, 1], [0, 0, 1, 1], params, sample_seed=0)
        assert [t.end_reason for t in trajs] == ["terminated"] * 2 + ["env_error"] * 2
    assert runner.get_metrics()["agents"]["agents_killed"] == 2
    # No agent thread was added, and the 4 later hung calls added no thread each (the
    # server's worker pool may grow by one as requests overlap differently).
    assert agent_threads() <= agents
    assert threading.active_count() - threads < 4
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert multiprocessing.active_children() == []
    runner.stop()


def test_hung_threads_are_bounded_by_moving_to_processes(tmp_path, caplog):
    """agent_isolation: thread with agent_max_hung_threads 2: the first batch leaves
    two hung threads, so the runner's next calls run in processes, killed at their
    timeout, and no thread is added."""
    cfg = agent_config(
        tmp_path, {"mode": "talk", "word": "up", "turns": 1}, {"mode": "hang", "seconds": 3600},
        {"split": "eval", "word": "up"}, agent_timeout_s=AGENT_TIMEOUT_S,
        max_env_error_share=1.0, agent_isolation="thread", agent_max_hung_threads=2,
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="ragen_rllib.agents.programs"):
        runner, _ = play(cfg, [0, 0, 1, 1])
    first = runner.get_metrics()["agents"]
    assert (first["hung_threads"], first["process_calls"], first["agents_killed"]) == (2, 0, 0)
    assert runner._agents.rollouts.isolation == "process"
    assert "agent_max_hung_threads is 2" in caplog.text
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    trajs = runner.run_episodes([0, 0, 1, 1], [0, 0, 1, 1], params, sample_seed=0)
    assert [t.end_reason for t in trajs] == ["terminated"] * 2 + ["env_error"] * 2
    second = runner.get_metrics()["agents"]
    assert (second["hung_threads"], second["process_calls"], second["agents_killed"]) == (2, 4, 2)
    assert multiprocessing.active_children() == []
    runner.stop()


def test_a_dead_gateway_restarts_and_nothing_collected_is_lost(tmp_path):
    cfg = agent_config(tmp_path, {"mode": "talk", "word": "up", "turns": 1}, {"split": "eval"})
    runner, first = play(cfg, [0, 0])
    gateway = runner._agents.rollouts.gateway
    gateway._server.should_exit = True  # the server dies between two batches
    gateway._thread.join(timeout=10)
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    second = runner.run_episodes([0, 0], [0, 0], params, sample_seed=1)
    assert [t.end_reason for t in second] == ["terminated"] * 2
    assert runner._agents.rollouts.restarts == 1 and runner._agents.rollouts.gateway is not gateway
    assert runner.get_metrics()["agents"]["gateway_restarts"] == 1
    runner.stop()


def test_evaluation_draws_the_held_out_tasks(tmp_path):
    cfg = agent_config(
        tmp_path,
        {"mode": "silent"},  # would fail: training tasks are not used
        {"split": "eval", "mode": "talk", "word": "up", "turns": 1},
        eval_samples_per_state=2,
    )
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    metrics, trajs = runner.evaluate(num_states=2, first_seed=0, temperature=0.5)
    assert len(trajs) == 2 and all(t.end_reason == "terminated" for t in trajs)
    wins = [float(sum(t.turn_rewards) > 0) for t in trajs]  # success: a positive return
    assert [t.success for t in trajs] == [w > 0 for w in wins]
    assert metrics["pass@1"] == pytest.approx(sum(wins) / 2) and metrics["env_errors"] == 0
    runner.stop()


def test_a_stalled_engine_times_requests_out_and_the_batch_ends_idle(tmp_path):
    """The engine stalls past agent_timeout_s: the agents' requests get 504 at the
    batch's deadline, the trajectories fail as timeouts or errors, and the batch
    returns only once the engine runs none of their requests."""
    cfg = agent_config(
        tmp_path, {"mode": "talk", "word": "up"}, {"split": "eval"}, agent_timeout_s=2
    )
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    generate, running = runner.engine._generate, []

    def stalled(request):
        running.append(1)
        time.sleep(4)
        try:
            return generate(request)
        finally:
            running.pop()

    runner.engine._generate = stalled
    params = SamplingParams(cfg.temperature, cfg.top_p, cfg.max_new_tokens)
    start = time.monotonic()
    trajs = runner.run_episodes([0, 0], [0, 0], params, sample_seed=0)
    # The batch waits for the stalled request (4 s), not for the idle wait's limit (120 s).
    assert time.monotonic() - start < 60
    assert running == []  # the engine is the runner's again
    assert [t.end_reason for t in trajs] == ["env_error"] * 2
    assert all("504" in t.error or "agent_timeout_s=2" in t.error for t in trajs), trajs[0].error
    runner.stop()


def test_a_context_overflow_keeps_the_turns_before_it(tmp_path):
    """The second request overflows max_context_tokens: the agent's first turn stands
    and the trajectory ends as context_overflow (its group is trained on); a first
    request that overflows leaves nothing to train (its group is dropped)."""
    cfg = agent_config(
        tmp_path,
        {"mode": "talk", "word": "up", "turns": 3},
        {"split": "eval"},
        max_context_tokens=80,
        max_new_tokens=40,
    )
    runner, (traj,) = play(cfg, [0])
    assert traj.end_reason == "context_overflow" and traj.num_turns >= 1, traj.error
    assert not traj.unplayable and traj.turn_rewards == [0.0] * traj.num_turns
    assert runner.get_metrics()["agents"]["context_overflows"] == 1
    long = {"mode": "talk", "word": "up " * 60, "turns": 1}
    cfg = agent_config(tmp_path, long, {"split": "eval"}, max_context_tokens=80, max_new_tokens=40)
    runner, (traj,) = play(cfg, [0])
    assert traj.end_reason == "context_overflow" and traj.unplayable
    assert "first prompt leaves no room" in traj.error


def test_report_labels_cut_paths_but_never_merge_settings():
    from ragen_rllib.cli.report_seeds import seed_groups

    params = [{"agent": f"/x/{d}/a.py:run", "seed": s} for d in ("one", "two") for s in (0, 1)]
    groups, _ = seed_groups(params)
    assert list(groups.values()) == [[0, 1], [2, 3]]  # two settings, though one file name
    params = [{"agent": f"/x/{d}.py:run", "seed": s} for d in ("one", "two") for s in (0, 1)]
    assert list(seed_groups(params)[0]) == ['agent="one.py:run"', 'agent="two.py:run"']


# ----- through the algorithm: Ray, the learner --------------------------------------------
@pytest.mark.slow
def test_an_openai_client_agent_trains_for_two_iterations(tmp_path):
    """tuned_examples/agents/bandit_agent.py (the openai client and the standard
    library) trains two iterations through StarPO."""
    example = ROOT / "tuned_examples" / "agents" / "bandit_agent.py"
    imported = {name.split(".")[0] for name in absolute_imports(example)}
    assert imported == {"__future__", "random", "re", "openai"}  # nothing of the project
    base = tiny_dict(
        agent=f"{example}:run", agent_tasks=f"{example}:tasks", max_new_tokens=24, max_turns=5
    )
    fields = """{"trained": learner["num_module_steps_trained"], "loss": learner["total_loss"],
              "env_errors": r["rollout"]["env_errors"],
              "agent_errors": r["env_runners"]["agents"]["agent_errors"]}"""
    out = train_iterations(tmp_path, base, fields, timeout=600)
    rows = out["rows"]
    assert out["repr"].startswith("StarPO(agent=bandit_agent.py:run; ")  # Ray's log prefix
    assert len(rows) == 2
    for row in rows:
        assert row["trained"] == 4 and row["env_errors"] == 0 and row["agent_errors"] == 0
        assert row["loss"] == row["loss"]  # a number, not NaN


@pytest.mark.slow
def test_a_langchain_agent_with_stop_sequences_trains_for_two_iterations(tmp_path):
    """tuned_examples/agents/guess_agent.py (LangChain's ChatOpenAI and messages, a
    stop sequence on every answer) trains two iterations through StarPO: its
    answers end at the stop sequence, and the history LangChain sends back
    continues each trajectory's recorded ids (no segment restarts)."""
    example = ROOT / "tuned_examples" / "agents" / "guess_agent.py"
    imported = {name.split(".")[0] for name in absolute_imports(example)}
    assert imported == {"__future__", "re", "langchain_core", "langchain_openai"}
    base = tiny_dict(
        agent=f"{example}:run",
        agent_tasks=f"{example}:tasks",
        max_new_tokens=32,
        max_context_tokens=1024,
        max_turns=5,
        llm="builtin",
    )  # fmt: skip  (the pretrained built-in model writes the <answer> block)
    fields = """{"trained": learner["num_module_steps_trained"], "loss": learner["total_loss"],
              "turns": r["rollout"]["num_turns_mean"],
              "agents": {k: v for k, v in r["env_runners"]["agents"].items()
                         if isinstance(v, (int, float))}}"""
    out = train_iterations(tmp_path, base, fields)
    rows = out["rows"]
    assert len(rows) == 2
    for row in rows:
        agents = row["agents"]
        assert row["trained"] == 4 and row["loss"] == row["loss"], row
        for failed in ("agent_errors", "agent_timeouts", "agent_no_model_call"):
            assert agents[failed] == 0, agents
        assert agents["stop_sequences"] >= 1, agents
        assert all(v == 0 for k, v in agents.items() if k.startswith("segment_restarts_")), agents
    assert max(row["turns"] for row in rows) > 1  # multi-turn: most guesses are wrong
