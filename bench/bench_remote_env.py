"""The remote env path's cost per env step against the same env in-process.

For each env, one ``python -m ragen_envs.remote.serve`` server on 127.0.0.1 and the same
answers played twice in one process: on the env made with ``gym.make`` and on
``ragen_envs.remote.OpenEnvTextEnv`` talking to the server (OpenEnv's WebSocket
session), side by side. ``--sessions`` envs are stepped in turn, as an env
runner steps its trajectories, each answer on each env once per round. Prints
microseconds per step and per reset for both paths and the overhead per step:

    python bench/bench_remote_env.py
    python bench/bench_remote_env.py --envs ragen/SimpleSokoban-v0 --sessions 64 --rounds 20
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

import gymnasium as gym

import ragen_envs  # noqa: F401  (registers the ids)
from ragen_envs.remote.client import OpenEnvTextEnv, check_server

ANSWERS = {
    "ragen/Bandit-v0": ["<think>x</think><answer>Dragon</answer>"],
    "ragen/FrozenLakeNoSlip-v0": [
        "<think>x</think><answer>Up</answer>",
        "<think>x</think><answer>Left || Down</answer>",
    ],
    "ragen/SimpleSokoban-v0": [
        "<think>x</think><answer>Up || Right</answer>",
        "<think>x</think><answer>Down</answer>",
    ],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(env_id: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "ragen_envs.remote.serve", env_id, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server for {env_id} exited with {proc.returncode}")
        try:
            check_server(f"http://127.0.0.1:{port}", timeout_s=1)
            return proc
        except ConnectionError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"no /health from the server for {env_id} within 60 s")


def play(envs: list[gym.Env], answers: list[str], rounds: int) -> tuple[float, float, int, int]:
    """(seconds in reset, seconds in step, resets, steps) for ``rounds`` rounds over
    ``envs``."""
    reset_s = step_s = 0.0
    steps = 0
    done = [True] * len(envs)
    episode = 0
    for r in range(rounds):
        for i, env in enumerate(envs):
            if done[i]:
                start = time.perf_counter()
                env.reset(seed=episode)
                reset_s += time.perf_counter() - start
                episode += 1
            start = time.perf_counter()
            _, _, term, trunc, _ = env.step(answers[r % len(answers)])
            step_s += time.perf_counter() - start
            steps += 1
            done[i] = term or trunc
    return reset_s, step_s, episode, steps


def measure(env_id: str, sessions: int, rounds: int) -> dict:
    port = free_port()
    server = start_server(env_id, port)
    try:
        local = [gym.make(env_id) for _ in range(sessions)]
        remote = [OpenEnvTextEnv(f"http://127.0.0.1:{port}") for _ in range(sessions)]
        answers = ANSWERS[env_id]
        play(remote[:1], answers, 2)  # connect and warm up
        out = {"env": env_id, "sessions": sessions}
        for name, envs in (("local", local), ("remote", remote)):
            reset_s, step_s, resets, steps = play(envs, answers, rounds)
            out[f"{name}_step_us"] = 1e6 * step_s / steps
            out[f"{name}_reset_us"] = 1e6 * reset_s / resets
            out[f"{name}_steps"] = steps
        for env in remote:
            env.close()
        out["overhead_us"] = out["remote_step_us"] - out["local_step_us"]
        return out
    finally:
        server.terminate()
        server.wait(timeout=20)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="*", default=list(ANSWERS))
    parser.add_argument("--sessions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    print(
        "| env | sessions | steps | in-process us/step | remote us/step | overhead us/step "
        "| in-process us/reset | remote us/reset |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for env_id in args.envs:
        r = measure(env_id, args.sessions, args.rounds)
        print(
            f"| {env_id} | {r['sessions']} | {r['remote_steps']} | {r['local_step_us']:,.0f} "
            f"| {r['remote_step_us']:,.0f} | {r['overhead_us']:,.0f} "
            f"| {r['local_reset_us']:,.0f} | {r['remote_reset_us']:,.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
