"""Remote envs over OpenEnv: ``python -m ragen_envs.remote.serve`` as a real server process,
played by the adapter (``env: openenv+http://...``) and by OpenEnv's own clients.

Every test talks HTTP and WebSocket to a real uvicorn server on a free port; nothing
of the protocol is mocked.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import pytest
from conftest import run_script, tiny_config, tiny_dict

# The `openenv` extra (the vLLM test environment does not install it).
pytest.importorskip("openenv")

import ragen_envs  # noqa: E402, F401  (registers the ids)
from ragen_envs.remote.client import (  # noqa: E402
    OpenEnvTextEnv,
    RemoteEnvError,
    base_url_of,
    check_server,
)
from ragen_envs.remote.serve import jsonable  # noqa: E402
from ragen_rllib.chat.prompts import render_turn, with_instructions  # noqa: E402

USER_ENVS = Path(__file__).resolve().parent / "user_envs"
SOKOBAN = "ragen/SimpleSokoban-v0"
#: Answers of every kind: valid moves, several per turn, broken format, invalid
#: actions, unicode of every width, control characters, a lone surrogate.
ANSWERS = [
    "<think>go up</think><answer>Up</answer>",
    "<think>a</think><answer>Left || Down || Right</answer>",
    "no tags at all",
    "<think>🙂 é 中文 עברית</think><answer>Jump</answer>",
    "<think>\x00\x1b[31m\u202e</think><answer>Down</answer>",
    "<think>\ud800</think><answer>Right || Up</answer>",
    "<think>x</think><answer>Up</answer>" * 50,
    "<think>the dragon pays</think><answer>Dragon</answer>",
    "<think>all in</think><answer>Down || Down || Right || Right || Up</answer>",
    "<think>more</think><answer>Left || Left || Up || Down || Right</answer>",
]


@pytest.fixture(scope="module", autouse=True)
def user_envs_importable():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(USER_ENVS))
        yield


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server subprocess on a port; ``url`` is its ``openenv+http://`` env id."""

    def __init__(self, argv: list[str], log: Path, port: int | None = None):
        self.argv, self.log, self.port = argv, log, port or free_port()
        self.url = f"openenv+http://127.0.0.1:{self.port}"
        self.base = base_url_of(self.url)
        self.proc: subprocess.Popen | None = None

    def start(self) -> Server:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, *self.argv, "--port", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=USER_ENVS,
                env={**os.environ, "PYTHONPATH": str(USER_ENVS)},
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                check_server(self.base, timeout_s=1)
                return self
            except ConnectionError:
                time.sleep(0.2)
        raise AssertionError(f"no /health within 60 s: {self.log.read_text()[-3000:]}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=20)


def serve(tmp: Path, env_id: str, *args: str, port: int | None = None) -> Server:
    name = f"{env_id.replace('/', '_').replace(':', '_')}-{time.monotonic_ns()}.log"
    return Server(["-m", "ragen_envs.remote.serve", env_id, *args], tmp / name, port).start()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Started on first use, one per (env id, args), stopped with the module."""
    tmp, started = tmp_path_factory.mktemp("servers"), {}

    def get(env_id: str, *args: str) -> Server:
        if (env_id, args) not in started:
            started[env_id, args] = serve(tmp, env_id, *args)
        return started[env_id, args]

    yield get
    for server in started.values():
        server.stop()


def play(env: gym.Env, seed: int, answers: list[str]) -> list:
    """Every value an episode shows the trainer: the first prompt, then per turn the
    observation, reward, ends and info (as JSON carries it), up to the episode's end."""
    obs, info = env.reset(seed=seed)
    steps = [with_instructions(env.unwrapped, render_turn(1, obs, info.get("actions_left"), None))]
    steps.append(jsonable(info))
    for answer in answers:
        obs, reward, terminated, truncated, info = env.step(answer)
        steps.append((obs, reward, terminated, truncated, jsonable(info)))
        if terminated or truncated:
            break
    return steps


@pytest.mark.parametrize(
    "env_id, env_config, endings",
    [
        (SOKOBAN, {}, {"terminated", "truncated"}),
        (
            "ragen/FrozenLakeNoSlip-v0",
            {"instructions": "compact", "coordinates": True},
            {"terminated"},
        ),
        ("ragen/Bandit-v0", {}, {"terminated"}),
    ],
)
def test_remote_episodes_equal_the_local_env(servers, env_id, env_config, endings):
    server = servers(env_id, "--env-config", json.dumps(env_config))
    remote = OpenEnvTextEnv(server.base, timeout_s=10)
    local = gym.make(env_id, **env_config)
    seen = set()
    for seed in (0, 7, 123456789):
        for start in range(0, len(ANSWERS), 3):  # several episodes, different answers
            answers = ANSWERS[start:] + ANSWERS[:start]
            got, want = play(remote, seed, answers), play(local, seed, answers)
            assert got == want
            _, _, terminated, truncated, info = want[-1]
            seen.add("terminated" if terminated else "truncated" if truncated else "open")
    assert seen == endings  # the episodes ran to their ends, of each kind the env has
    assert {"success", "format_ok", "action_is_valid", "actions_left"} <= set(info)
    assert remote.instructions() == local.unwrapped.instructions()
    remote.close()


def test_the_official_openenv_clients_play_the_server(servers):
    from openenv.core.generic_client import GenericEnvClient

    from ragen_envs.remote.protocol import AnswerAction, RagenEnvClient

    server = servers(SOKOBAN, "--env-config", "{}")
    local = gym.make(SOKOBAN)
    text, _ = local.reset(seed=5)
    want = local.step(ANSWERS[1])
    with GenericEnvClient(base_url=server.base).sync() as client:
        first = client.reset(seed=5)
        assert first.observation["text"] == text and first.done is False
        result = client.step({"answer": ANSWERS[1]})
        assert (result.observation["text"], result.reward) == want[:2]
        assert result.observation["info"] == jsonable(want[4])
        state = client.state()
        assert state["step_count"] == 1 and state["env_id"] == SOKOBAN
    with RagenEnvClient(base_url=server.base).sync() as client:
        client.reset(seed=5)
        result = client.step(AnswerAction(answer=ANSWERS[1]))
        assert result.observation.text == want[0] and result.observation.info["success"] is False
    schema = json.load(urllib.request.urlopen(f"{server.base}/schema", timeout=5))
    assert schema["action"]["required"] == ["answer"]
    request = urllib.request.Request(
        f"{server.base}/reset", data=b'{"seed": 5}', headers={"content-type": "application/json"}
    )
    assert json.load(urllib.request.urlopen(request, timeout=5))["observation"]["text"] == text


def test_hostile_answers_leave_the_server_serving(servers, tmp_path):
    server = servers(SOKOBAN, "--env-config", "{}")
    remote = OpenEnvTextEnv(server.base, timeout_s=10)
    remote.reset(seed=1)
    with pytest.raises(RemoteEnvError, match="more than this server's --max-answer-chars=65536"):
        remote.step("<answer>" + "é" * 100_000 + "</answer>")  # refused by the env
    remote.reset(seed=1)
    with pytest.raises(RemoteEnvError, match="step\\(\\) on .* failed"):
        remote.step("🙂" * 1_000_000)  # 1 MB past the message limit: the socket is closed
    check_server(server.base)
    assert remote.reset(seed=1) == gym.make(SOKOBAN).reset(seed=1)  # a new connection
    # A body declared past the limit is refused from its headers, before it is read (so
    # a client still writing it may see the connection close: only the headers go here).
    host, port = server.base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.putrequest("POST", "/step")
    conn.putheader("Content-Type", "application/json")
    conn.putheader("Content-Length", str(2_000_000))
    conn.endheaders()
    assert conn.getresponse().status == 413
    conn.close()
    # A server that allows it plays a megabyte of unicode like the local env does.
    big = servers(SOKOBAN, "--env-config", "{}", "--max-answer-chars", "2000000")
    answer = "<think>" + "🙂é\u202e" * 333_333 + "</think><answer>Up</answer>"
    roomy = OpenEnvTextEnv(big.base, timeout_s=20)
    assert play(roomy, 3, [answer]) == play(gym.make(SOKOBAN), 3, [answer])
    check_server(server.base)
    remote.close()
    roomy.close()


def test_a_dead_or_stuck_server_gives_remote_env_errors_not_hangs(tmp_path):
    server = serve(tmp_path, SOKOBAN)
    # A timeout far above a healthy call's time, and bounds far above the timeout: what
    # is checked is that a stuck or dead server ends in an error, not in a hang.
    remote = OpenEnvTextEnv(server.base, timeout_s=5, connect_timeout_s=5)
    try:
        remote.reset(seed=2)
        remote.step(ANSWERS[0])
        server.proc.send_signal(signal.SIGSTOP)  # alive, but answers nothing
        start = time.monotonic()
        with pytest.raises(RemoteEnvError, match="did not answer within timeout_s=5"):
            remote.step(ANSWERS[0])
        assert time.monotonic() - start < 30
        server.proc.send_signal(signal.SIGCONT)
        with pytest.raises(RemoteEnvError, match="no episode"):
            remote.step(ANSWERS[0])  # the timed-out episode is not resumed
        remote.reset(seed=2)
        server.stop(signal.SIGKILL)  # dies mid-episode
        start = time.monotonic()
        with pytest.raises(RemoteEnvError, match=r"the server-side episode\) was lost"):
            remote.step(ANSWERS[0])
        with pytest.raises(RemoteEnvError, match="cannot reach"):
            remote.reset(seed=2)
        assert time.monotonic() - start < 30
        # Back on the same port: the lost episode is refused, a new one plays.
        server = serve(tmp_path, SOKOBAN, port=server.port)
        with pytest.raises(RemoteEnvError, match="no episode"):
            remote.step(ANSWERS[0])
        assert remote.reset(seed=2) == gym.make(SOKOBAN).reset(seed=2)
    finally:
        server.stop(signal.SIGKILL)
        remote.close()


def test_the_config_check_names_the_env_key():
    port = free_port()  # nothing listens there
    with pytest.raises(ValueError, match=r"config env='openenv\+http://127.0.0.1:\d+': the "):
        tiny_config(env=f"openenv+http://127.0.0.1:{port}").check_values()
    with pytest.raises(ValueError, match="config env='openenv\\+http://' is invalid"):
        tiny_config(env="openenv+http://").check_values()
    with pytest.raises(ValueError, match="is invalid: .*no query"):
        tiny_config(env="openenv+http://host:1/?x=1").check_values()


def test_env_config_and_runner_errors_plug_into_the_env_error_path(servers):
    from ragen_rllib.connectors.sample_batch import EnvErrorBudgetExceeded, build_sample_pipeline
    from ragen_rllib.env_choice.env_loading import make_eval_env
    from ragen_rllib.env_choice.eval_suites import resolve_suites
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
    from ragen_rllib.env_runner.metrics import rollout_metrics

    server = servers("ragen/Bandit-v0", "--env-config", "{}")
    with pytest.raises(ValueError, match="config env_config=.*timeout_s must be a positive"):
        tiny_config(env=server.url, env_config={"timeout_s": 0}).check_values()
    with pytest.raises(ValueError, match="config env_config=.*unexpected keyword.*preset"):
        tiny_config(env=server.url, env_config={"preset": "x"}).check_values()  # the server's
    cfg = tiny_config(env=server.url, env_config={"timeout_s": 5})
    cfg.check_values()

    def seen(trajs):  # what the trainer sees of each trajectory
        return [(t.turn_prompts, t.answers, t.turn_rewards, t.end_reason, t.success) for t in trajs]

    remote = LLMEnvRunner(config=cfg, worker_index=0).sample()
    local = LLMEnvRunner(config=tiny_config(), worker_index=0).sample()
    assert seen(remote) == seen(local) and len(remote) == 4
    assert all(t.end_reason != "env_error" and len(t.turn_rewards) == 1 for t in remote)
    # An evaluation suite may name the server: the run's adapter options come along.
    suites = resolve_suites(cfg, {"remote": [{"env": server.url, "name": "srv"}]})
    assert suites["remote"][0].env_config == {"timeout_s": 5}
    probe = make_eval_env(suites["remote"][0])
    assert probe.reset(seed=3) == gym.make("ragen/Bandit-v0").reset(seed=3)
    probe.close()
    cfg.env = f"openenv+http://127.0.0.1:{free_port()}"  # the server is gone
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    assert [t.end_reason for t in trajs] == ["env_error"] * 4
    assert trajs[0].error.startswith("reset(): RemoteEnvError: reset(): cannot reach")
    assert rollout_metrics(trajs)["env_errors"] == 4
    with pytest.raises(EnvErrorBudgetExceeded, match="4 of 4 trajectories"):
        build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs)


def test_a_foreign_openenv_env_by_field_names_and_by_subclass(tmp_path):
    server = Server(["openenv_word_game.py"], tmp_path / "word.log").start()
    env = OpenEnvTextEnv(server.base, action_field="word", observation_field="prompt")
    obs, info = env.reset(seed=1)
    word = obs.split()[-1].rstrip(".")
    assert env.instructions is None and info == {}
    assert with_instructions(env, "turn") == "turn"  # no instructions: the turn alone
    assert env.step("wrong") == (f"No. Say the word {word}.", 0.0, False, False, {"hit": False})
    assert env.step(word) == ("Right.", 1.0, True, False, {"hit": True})
    sub = gym.make("openenv_word_game:WordGameRemote-v0", base_url=server.base).unwrapped
    obs, _ = sub.reset(seed=1)
    assert obs.endswith("Answer as <answer>word</answer>.")
    assert sub.step(f"<think>easy</think><answer> {word} </answer>")[1:3] == (1.0, True)
    env.close()
    sub.close()
    server.stop()


@pytest.mark.slow
def test_a_short_training_run_on_a_remote_env(servers, tmp_path):
    """Through Ray and the learner, two iterations against the server: every
    trajectory plays, the update runs, the rollout metrics are those of the env."""
    server = servers("ragen/Bandit-v0", "--env-config", "{}")
    config = tiny_dict(env=server.url, env_groups=4, env_config={"timeout_s": 10})
    script = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
algo = StarPOConfig.from_user_dict(config).build_algo()
rows = []
for _ in range(2):
    r = algo.train()
    rows.append({"trajectories": r["rollout"]["num_trajectories"],
                 "errors": r["rollout"]["env_errors"],
                 "success": r["rollout"]["success_rate"],
                 "trained": r["learners"]["default_policy"]["num_module_steps_trained"],
                 "loss": r["learners"]["default_policy"]["policy_loss"]})
algo.stop()
print(json.dumps(rows, default=float))
"""
    rows = run_script(script, tmp_path, timeout=300, define={"config": config})
    assert [(r["trajectories"], r["errors"], r["trained"]) for r in rows] == [(8, 0, 8)] * 2
    assert all(0.0 <= r["success"] <= 1.0 and r["loss"] == r["loss"] for r in rows)


def test_an_env_mix_entry_may_be_a_server(servers):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

    server = servers("ragen/Bandit-v0", "--env-config", "{}")
    mix = [
        {"env": server.url, "groups": 1, "name": "remote", "env_config": {"timeout_s": 5}},
        {"env": "ragen/FrozenLakeNoSlip-v0", "groups": 1, "max_turns": 2},
    ]
    base = {k: v for k, v in tiny_dict().items() if k not in ("env", "env_groups")}
    cfg = StarPOConfig.from_user_dict({**base, "env_mix": mix, "max_turns": 2})
    cfg.check_values()
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    assert sorted(t.env_name for t in trajs) == ["FrozenLakeNoSlip"] * 2 + ["remote"] * 2
    assert not [t.error for t in trajs if t.end_reason == "env_error"]
    bad = [{**mix[0], "env": f"openenv+http://127.0.0.1:{free_port()}"}, mix[1]]
    with pytest.raises(ValueError, match=r"config env_mix\[0\]: config env='openenv.*does not"):
        StarPOConfig.from_user_dict({**base, "env_mix": bad, "max_turns": 2}).check_values()
