"""Build the built-in model's shipped weights, with a record of how they were made.

    python -m ragen_rllib.builtin.build                      # the shipped build
    python -m ragen_rllib.builtin.build --steps 3 --out /tmp/x --no-checks  # a smoke run
    python -m ragen_rllib.builtin.build --recheck            # re-run the checks only

The shipped build pretrains the default :class:`~ragen_rllib.builtin.spec.BuiltinSpec`
(seed 0) on random-play transcripts and writes a standard Hugging Face model
directory to ``ragen_rllib/builtin/weights/`` (a few MB), which ``model: builtin``
then loads as it is: no user builds it. ``build_info.json`` beside the weights
records:

- ``key``: the digest of every build parameter, the vocabulary and the build
  version (the same digest that names cached builds); a checkout whose code
  would build another model refuses the stale files and builds into the cache;
- ``sha256`` of every file, checked before the files are used;
- the exact versions of Python, torch, transformers, tokenizers, numpy and
  gymnasium, the thread count, the wall time and the loss curve (every 50th step);
- ``checks``: the share of sampled first answers that are well formed (5
  sampling seeds, both prompt styles, and per env), the share the env also
  accepts in its state (per env), and how often the model predicts a whole
  next observation exactly (teacher forcing, held-out seeds).

A rebuild on another machine or with other versions may differ in the last
bits of the weights (float sums run in another order); that is why the
weights ship instead of being rebuilt on each machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from importlib import metadata
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from ragen_rllib.builtin.model import (
    INFO_FILE,
    PACKAGED_DIR,
    build_key,
    build_model,
    file_digests,
)
from ragen_rllib.builtin.pretraining import pretrain
from ragen_rllib.builtin.quality import GATE_PROMPTS, gate_draws, next_observation_accuracy
from ragen_rllib.builtin.spec import BUILD_VERSION, BuiltinSpec
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab

logger = logging.getLogger(__name__)

_VERSIONED = ("torch", "transformers", "tokenizers", "numpy", "gymnasium")


def versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in _VERSIONED:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "missing"
    return found


def quality_checks(path: str) -> dict[str, Any]:
    """The warm-start gate and the next-observation check of the model at ``path``:
    sampled first answers at temperature 1 (:func:`gate_draws`: 5 sampling seeds of
    192 prompts in each prompt style): the share well formed (per seed, the gate;
    and per env over all 10 draws), the share the env also accepts in its state (per
    env), and the next-observation accuracy."""
    per_env: dict[str, list[int]] = {}
    overall: dict[str, list[float]] = {}
    for style, draws in gate_draws(path).items():
        overall[style] = []
        for counts in draws:
            overall[style].append(sum(w for w, _, _ in counts.values()) / GATE_PROMPTS)
            for env_id, row in counts.items():
                acc = per_env.setdefault(env_id, [0, 0, 0])
                for i, value in enumerate(row):
                    acc[i] += value
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    return {
        "format_valid_T1": overall,
        "format_valid_T1_per_env": {e: round(w / t, 4) for e, (w, _, t) in per_env.items()},
        "accepted_T1_per_env": {e: round(a / t, 4) for e, (_, a, t) in per_env.items()},
        "next_observation_exact": next_observation_accuracy(
            model, AutoTokenizer.from_pretrained(path)
        ),
    }


def build(
    out: str,
    *,
    steps: int | None = None,
    seed: int = 0,
    threads: int = 2,
    checks: bool = True,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pretrain the default spec (with ``overrides``) and write the model and its
    ``build_info.json`` to ``out``."""

    spec = BuiltinSpec(**(overrides or {}))
    steps = spec.pretrain_steps if steps is None else steps
    torch.set_num_threads(threads)
    start = time.perf_counter()
    tokenizer = build_tokenizer(*build_vocab(spec.corpus_seeds))
    model = build_model(tokenizer, spec, seed)
    losses = pretrain(model, tokenizer, spec, seed, steps=steps)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    wall = time.perf_counter() - start
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-builtin-", dir=parent)
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        info: dict[str, Any] = {
            # The shipped key is that of the full schedule; a shortened build is not it.
            "key": build_key(True, seed, spec) if steps == spec.pretrain_steps else None,
            "build_version": BUILD_VERSION,
            "seed": seed,
            "steps": steps,
            "spec": spec.__dict__,
            "threads": threads,
            "versions": versions(),
            "wall_s": round(wall, 1),
            "loss_every_50_steps": [round(x, 4) for x in losses[::50]] + [round(losses[-1], 4)]
            if losses
            else [],
            "sha256": file_digests(tmp),
        }
        if checks:
            info["checks"] = quality_checks(tmp)
        with open(os.path.join(tmp, INFO_FILE), "w") as f:
            json.dump(info, f, indent=1)
        shutil.rmtree(out, ignore_errors=True)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return info


def recheck(out: str) -> dict[str, Any]:
    """Re-run :func:`quality_checks` on the build at ``out`` (its files must match the
    recorded sha256) and rewrite the ``checks`` of its ``build_info.json``."""
    info_path = os.path.join(out, INFO_FILE)
    with open(info_path) as f:
        info = json.load(f)
    if file_digests(out) != info["sha256"]:
        raise SystemExit(f"{out}: the files do not match the sha256 in {INFO_FILE}")
    info["checks"] = quality_checks(out)
    with open(info_path, "w") as f:
        json.dump(info, f, indent=1)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=PACKAGED_DIR, help="model directory to (re)write")
    parser.add_argument("--steps", type=int, default=None, help="default: the spec's schedule")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-checks", action="store_true", help="skip the format/obs checks")
    parser.add_argument(
        "--recheck", action="store_true", help="re-run the checks of the build at --out only"
    )
    parser.add_argument(
        "--spec", default=None, help="JSON object of BuiltinSpec fields to change (experiments)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.recheck:
        torch.set_num_threads(args.threads)
        json.dump(recheck(args.out)["checks"], sys.stdout, indent=1)
        return 0
    info = build(
        args.out,
        steps=args.steps,
        seed=args.seed,
        threads=args.threads,
        checks=not args.no_checks,
        overrides=json.loads(args.spec) if args.spec else None,
    )
    summary = {k: info[k] for k in ("key", "steps", "wall_s", "versions", "checks") if k in info}
    json.dump(summary, sys.stdout, indent=1)
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
