"""Fuzz every registered env with many adversarial answers and count what breaks.

Each env gets ``--answers`` answers (default 100,000), played as turns of
episodes (a finished episode is reset with the next seed). An answer is drawn
from four kinds, in turn:

- random text: code points from ASCII, Latin, CJK, emoji and lone surrogates;
- tag soup: the format's tags, separators, the env's own words (action names,
  digits and operators, placements, ``search:``) and random words, shuffled;
- a mutated well-formed answer: the demo planner's or random agent's answer
  with characters deleted, repeated or replaced;
- every 10,000th answer, a megabyte of one of the above.

It counts exceptions raised by ``reset()``/``step()`` (by type), observations
that are not ``str`` or fall outside the observation space, and rewards that are
not finite floats, and prints a table with the steps per second and the time
a reset takes (mean and slowest, resets timed alone):

    python bench/bench_env_fuzz.py                    # 100,000 answers per env
    python bench/bench_env_fuzz.py --answers 2000 --envs ragen/Countdown-v0
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections import Counter

import gymnasium as gym
import numpy as np

import ragen_envs
from ragen_envs import demo

TAGS = ["<think>", "</think>", "<answer>", "</answer>", "||", "|", "<", ">", "/", "\n", " "]
WORDS = ["search:", "answer:", "r1c1=", "r9c9=9", "=", "(", ")", "+", "-", "*", "/", "0",
         "1e9", "99999999999999999999", "Up", "left", "DOWN", "Dragon", "#### 4", "\\boxed{",
         "}"]  # fmt: skip
# Code point ranges: ASCII, Latin-1, CJK, emoji, lone surrogates.
RANGES = [(32, 127), (160, 600), (0x4E00, 0x4F00), (0x1F600, 0x1F650), (0xD800, 0xD8FF)]


def random_text(rng: np.random.Generator, n: int) -> str:
    lo, hi = RANGES[int(rng.integers(len(RANGES)))]
    return "".join(map(chr, rng.integers(lo, hi, size=n)))


def env_words(env) -> list[str]:
    names = list(getattr(env, "action_names", ()) or ())
    return names + WORDS


def tag_soup(rng: np.random.Generator, words: list[str]) -> str:
    pool = TAGS + words
    parts = [pool[int(i)] for i in rng.integers(len(pool), size=int(rng.integers(1, 30)))]
    if rng.random() < 0.3:
        parts.insert(int(rng.integers(len(parts) + 1)), random_text(rng, 8))
    return "".join(parts)


def mutated(rng: np.random.Generator, env) -> str:
    agent = demo.planner if rng.random() < 0.5 else demo.random_agent
    try:
        actions = agent(env, rng)
    except Exception:  # noqa: BLE001 - a planner without a move for this state
        actions = ["Up"]
    text = list(demo._answer(actions, getattr(getattr(env, "parser", None), "separator", "||")))
    for _ in range(int(rng.integers(0, 4))):
        if not text:
            break
        i = int(rng.integers(len(text)))
        op = int(rng.integers(3))
        if op == 0:
            del text[i]
        elif op == 1:
            text.insert(i, text[i] * int(rng.integers(2, 50)))
        else:
            text[i] = random_text(rng, 1)
    return "".join(text)


def answer(rng: np.random.Generator, env, k: int) -> str:
    kind = k % 3
    if kind == 0:
        text = random_text(rng, int(rng.integers(0, 200)))
    elif kind == 1:
        text = tag_soup(rng, env_words(env))
    else:
        text = mutated(rng, env)
    if k % 10_000 == 9_999:
        text = (text or "x") * (1_000_000 // max(1, len(text or "x")) + 1)
    return text


def fuzz(env_id: str, answers: int, seed: int = 0) -> dict:
    env = gym.make(env_id)
    inner = env.unwrapped
    rng = np.random.default_rng(seed)
    errors: Counter[str] = Counter()
    first_error = ""
    bad_obs = bad_reward = format_ok = episodes = 0
    resets: list[float] = []

    def reset(seed: int) -> None:
        t = time.perf_counter()
        env.reset(seed=seed)
        resets.append(time.perf_counter() - t)

    start = time.perf_counter()
    reset(0)
    for k in range(answers):
        try:
            obs, reward, term, trunc, info = env.step(answer(rng, inner, k))
            if not isinstance(obs, str) or not env.observation_space.contains(obs):
                bad_obs += 1
            if not isinstance(reward, float) or not math.isfinite(reward):
                bad_reward += 1
            format_ok += bool(info.get("format_ok"))
            if term or trunc:
                episodes += 1
                reset(episodes)
        except Exception as err:  # noqa: BLE001 - counted, that is the point
            errors[type(err).__name__] += 1
            first_error = first_error or traceback.format_exc(limit=3)
            episodes += 1
            reset(episodes)
    elapsed = time.perf_counter() - start
    return {
        "env": env_id,
        "answers": answers,
        "episodes": episodes,
        "exceptions": sum(errors.values()),
        "by_type": dict(errors),
        "bad_observations": bad_obs,
        "bad_rewards": bad_reward,
        "format_ok_share": format_ok / answers,
        "steps_per_s": answers / elapsed,
        "reset_ms_mean": 1e3 * float(np.mean(resets)),
        "reset_ms_max": 1e3 * max(resets),
        "first_error": first_error,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=100_000)
    parser.add_argument("--envs", nargs="*", default=list(ragen_envs.ENV_IDS))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        "| env | answers | episodes | exceptions | bad obs | bad rewards | format ok | steps/s "
        "| reset ms (mean / max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    failed = False
    for env_id in args.envs:
        r = fuzz(env_id, args.answers, args.seed)
        failed |= bool(r["exceptions"] or r["bad_observations"] or r["bad_rewards"])
        print(
            f"| {env_id} | {r['answers']:,} | {r['episodes']:,} | {r['exceptions']} "
            f"| {r['bad_observations']} | {r['bad_rewards']} | {r['format_ok_share']:.1%} "
            f"| {r['steps_per_s']:,.0f} | {r['reset_ms_mean']:.2f} / {r['reset_ms_max']:.1f} |",
            flush=True,
        )
        if r["first_error"]:
            print(r["by_type"], r["first_error"], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
