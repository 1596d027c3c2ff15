"""Seeded fuzzing of the `rllib train file` front end over every tuned example.

Each tuned example in ``tuned_examples/*.yaml`` gets ``MUTATIONS`` seeded mutations
(wrong types, NaN/inf, booleans and strings for numbers, nested dicts/lists, null,
unknown keys, removed keys, out-of-range values, grid_search misuse, wrong
top-level and experiment-level shapes, values given through ``--config``). Each
mutated file goes through ``ragen_rllib.cli.main([... "--dry-run"])`` in-process,
and the mutation generator's own verdict decides what must happen:

* ``invalid`` (surely invalid): exit code 2 with an error that names the mutated key;
* ``maybe`` (possibly valid, e.g. an in-range value of a key with cross-key
  constraints, or any change to an example that needs a GPU or a hub model):
  exit 0, or exit 2 with an error that names some key;
* ``valid`` (surely valid, only on examples that pass unmutated): exit 0.

Always: no traceback, no exception out of ``main``, and each mutation finishes in a
few seconds (no network wait: the GPU examples' hub model fails fast offline).
The tally per example is printed (``pytest -s``), and ``python tests/test_config_fuzz.py``
prints it without pytest (with ``RAGEN_RLLIB_CACHE`` pointing at a built model).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import random
import re
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ragen_rllib.algorithms.starpo.config.knob import RLLIB_OWN
from ragen_rllib.algorithms.starpo.config.knobs import KNOBS
from ragen_rllib.algorithms.starpo.config.rules import Rule
from ragen_rllib.algorithms.starpo.config.yaml_front import KEY_LISTING_HEADER

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "tuned_examples").glob("*.yaml"))
MUTATIONS = 200
SECONDS_PER_MUTATION = 8.0  # generous for a slow CI machine; typical is well under 0.1 s


# ----- the spec: read from the knobs' declarations --------------------------------
#: key (as a YAML file writes it) -> its knob: default, rule, whether other keys may
#: still reject a value its rule allows (`cross`).
def spec_from(knobs: dict) -> tuple[dict[str, Any], set[str]]:
    """key -> knob, and the keys whose valid values may still be rejected together
    with other keys' values (filtering and minibatch bounds, GRPO group size, eval
    seed range, GPUs, the env, the model, the context bound against the first prompt
    and the model's positions): a single-key-valid value of these is only `maybe`."""
    by_key = {knob.key: knob for knob in knobs.values()}
    return by_key, {key for key, knob in by_key.items() if knob.cross}


BY_KEY, CROSS_KEYS = spec_from(KNOBS)
CONFIG_KEYS = sorted(BY_KEY)
ENV_IDS = ("ragen/Bandit-v0", "ragen/FrozenLake-v0", "ragen/SimpleSokoban-v0")
BUILTIN_SUITES = {"bandit", "sokoban", "frozenlake"}
EXPERIMENT_KEYS = {"run", "env", "stop", "config", "checkpoint_config", "storage_path"}
CHECKPOINT_KEYS = {"checkpoint_frequency", "checkpoint_at_end", "num_to_keep"}
ALL_KEY_NAMES = set(CONFIG_KEYS) | {"lambda_"} | EXPERIMENT_KEYS | CHECKPOINT_KEYS


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def single_key_ok(key: str, v: Any) -> bool | None:
    """Whether `v` is valid for config `key` on its own (None: can't tell)."""
    rule = BY_KEY[key].rule
    if not rule.ok(v):  # every rule is applied: a value it refuses is refused
        return False
    if rule.kind != "other":  # an int, number, bool or choice: its rule is all there is
        return True
    if key == "seed":
        return v is None or (_int(v) and 0 <= v < 2**32)
    if key == "prefill":  # with a format warm-up, only one that starts '<think>'
        return isinstance(v, str)
    if key == "prompt":  # null, or a mapping of parts (checked in depth)
        return True if v is None else (None if isinstance(v, dict) else False)
    if key == "num_cpus_per_learner":
        return v == "auto" or (_num(v) and v >= 0)
    if key == "llm":  # a string may be a hub id or a directory somewhere else
        return None if isinstance(v, str) and v.strip() else False
    if key == "env":
        return v in ENV_IDS
    if key in ("agent", "agent_tasks"):  # whether it imports, and the other is there
        return None if v is None or isinstance(v, str) else False
    if key == "env_module":  # any string may name an importable module ("abc" does)
        return None if v is None or isinstance(v, str) else False
    if key == "env_config":
        return None if v == {} else False  # the built-in envs take no kwarg named "a"
    if key == "eval_pass_k":  # each k must also be <= eval_samples_per_state
        return isinstance(v, list) and bool(v) and all(_int(k) and k >= 1 for k in v)
    if key == "engine_sleep_level":  # > 0 only with the engine beside the learner
        return v is None or (_int(v) and v in (0, 1, 2))
    if key == "env_mix":  # null (env alone) or entries; env and env_groups must agree
        if v is None:
            return True
        entry_keys = {"env", "groups", "env_config", "name", "max_turns", "prompt_style", "prompt"}
        if isinstance(v, list) and v and all(isinstance(e, dict) for e in v):
            if all(
                set(e) <= entry_keys and e.get("env") in ENV_IDS and _int(e.get("groups"))
                and e["groups"] >= 1 and set(e) <= {"env", "groups"}
                for e in v
            ):  # fmt: skip
                names = [e["env"] for e in v]
                return len(set(names)) == len(names)
            return None
        return False
    if key == "eval_suites":  # null, built-in names, or a mapping (checked in depth)
        if v is None or (isinstance(v, list) and v and all(n in BUILTIN_SUITES for n in v)):
            return True
        if isinstance(v, str):
            return v in BUILTIN_SUITES
        return None if isinstance(v, dict) and v else False
    if key == "curriculum":  # null or stages; whether the env takes the options is the env's
        if v is None:
            return True
        return None if isinstance(v, list) and v and all(isinstance(s, dict) for s in v) else False
    return None  # a rule of its own that the value passes: the checks decide


def shaped_sample(rule: Rule, rng: random.Random) -> Any:
    """A value inside a shaped rule's bounds (its edges included when closed)."""
    extra = [None] if rule.none_ok else []
    if rule.kind == "bool":
        return rng.choice([True, False])
    if rule.kind == "choice":
        return rng.choice(list(rule.choices) + extra)
    if rule.kind == "int":
        low = int(rule.low)
        high = int(min(rule.high, low + 64))
        return rng.choice([low, low + 1, (low + high) // 2, high] + extra)
    low = 0.0 if rule.low is None else float(rule.low)
    high = low + 10.0 if rule.high is None else float(rule.high)
    inside = [low + (high - low) * f for f in (0.1, 0.5, 0.9)]
    edges = ([] if rule.low_open else [low, int(low)]) + ([] if rule.high_open else [high])
    return rng.choice(inside + edges + extra)


def valid_sample(key: str, rng: random.Random) -> Any:
    """A value that is valid for `key` on its own."""
    rule = BY_KEY[key].rule
    if rule.kind != "other" and key != "filter_value":  # (its range is the strategy's)
        return shaped_sample(rule, rng)
    special = {
        "seed": rng.choice([None, 0, 7, 12345]),
        "prefill": rng.choice(["", "<think>", "Let me think."]),
        "filter_value": rng.choice([None, 0.25, 0.9, 1.0, 2]),
        "num_cpus_per_learner": rng.choice(["auto", 1, 0.5]),
        "llm": rng.choice(["builtin", "builtin-raw", "no-such-org/no-such-model", "1e-4"]),
        "env": rng.choice(ENV_IDS),
        "env_module": rng.choice([None, "json"]),
        "env_config": {},
        "eval_pass_k": rng.choice([[1], [1, 4]]),
        "engine_sleep_level": rng.choice([None, 0, 1, 2]),
        "eval_suites": rng.choice([None, ["bandit"], ["frozenlake", "sokoban"]]),
        "env_mix": rng.choice(
            [None, [{"env": ENV_IDS[0], "groups": 2}, {"env": ENV_IDS[1], "groups": 2}]]
        ),
        "curriculum": rng.choice([None, [{"from_iteration": 0, "reset_options": {}}]]),
        "prompt": rng.choice([None, {"system": "Play the game."}, {"format_hint": "Be brief."}]),
    }
    if key in special:
        return special[key]
    default = BY_KEY[key].default  # every knob's own default is valid alone
    return {} if default is RLLIB_OWN else copy.deepcopy(default)


GENERIC_VALUES = [
    float("nan"), float("inf"), -float("inf"), True, False, "1e-4", "8", "0.5", "abc", "",
    {"a": 1}, {}, [1, 2], [], None, -1, 0, 1, 2, 0.5, 1.0, 1.5, -0.5, 2.5, 8.0, 2**31,
    10**30, 1e-4, 1e308, {"nested": {"x": [1, {"y": None}]}}, ["a", {"b": 2}],
]  # fmt: skip
UNKNOWN_CONFIG_KEYS = [
    "grup_size", "model", "train_batch_size", "lr_schedule", "callbacks", "num_envs_per_env_runner",
    "evaluation_interval", "learning_rate", "GROUP_SIZE", "lambda__", "zz_fuzz_key",
]  # fmt: skip


# ----- mutations -------------------------------------------------------------------
@dataclass
class Mutation:
    what: str  # for failure messages
    data: Any  # what the YAML file holds
    names: list[str]  # an error must name one of these
    verdict: str  # "invalid", "maybe" or "valid"
    extra_args: list[str] = field(default_factory=list)


def _verdict(key: str, value: Any, base_ok: bool) -> str:
    ok = single_key_ok(key, value)
    if ok is False:
        return "invalid"
    if ok is True and base_ok and key not in CROSS_KEYS:
        return "valid"
    return "maybe"


def _key_names(key: str) -> list[str]:
    return [key, "lambda_"] if key == "lambda" else [key]


def mutate(example: dict[str, Any], rng: random.Random, base_ok: bool) -> Mutation:
    data = copy.deepcopy(example)
    name = next(iter(data))
    exp = data[name]
    config = exp.setdefault("config", {})
    kind = rng.choices(
        ["value", "valid_value", "override", "unknown", "remove", "grid", "experiment", "top"],
        weights=[34, 16, 8, 8, 8, 8, 14, 4],
    )[0]
    if kind in ("value", "valid_value", "override"):
        key = rng.choice(sorted(config) if rng.random() < 0.6 else CONFIG_KEYS)
        if kind == "valid_value":
            value = valid_sample(key, rng)
        else:
            value = copy.deepcopy(rng.choice(GENERIC_VALUES))
        verdict = _verdict(key, value, base_ok)
        if kind == "override":
            args = ["--config", json.dumps({key: value})]
            return Mutation(f"--config {key}={value!r}", data, _key_names(key), verdict, args)
        config[key] = value
        return Mutation(f"config {key}={value!r}", data, _key_names(key), verdict)
    if kind == "unknown":
        key = rng.choice(UNKNOWN_CONFIG_KEYS)
        config[key] = rng.choice([4, "x", None, {"a": 1}])
        return Mutation(f"unknown config key {key}", data, [key], "invalid")
    if kind == "remove":
        if not config:
            return Mutation("nothing to remove", data, [], "valid" if base_ok else "maybe")
        key = rng.choice(sorted(config))
        del config[key]
        return Mutation(f"removed config {key}", data, [], "maybe")
    if kind == "grid":
        key = rng.choice(sorted(config) if rng.random() < 0.7 else CONFIG_KEYS)
        good = [valid_sample(key, rng), valid_sample(key, rng)]
        bad = rng.choice([v for v in GENERIC_VALUES if single_key_ok(key, v) is False])
        choice = rng.randrange(6)
        if choice == 0:
            config[key] = {"grid_search": []}
        elif choice == 1:
            config[key] = {"grid_search": rng.choice([5, "x", None, {"a": 1}])}
        elif choice == 2:
            config[key] = {"grid_search": good, "extra": 1}
        elif choice == 3:
            config[key] = {"grid_search": [good[0], bad]}
        elif choice == 4:
            config["env_config"] = {"size": {"grid_search": [1, 2]}}
            return Mutation("grid_search nested in env_config", data, ["env_config"], "invalid")
        else:
            config[key] = {"grid_search": good}
            verdicts = {_verdict(key, v, base_ok) for v in good}
            verdict = "valid" if verdicts == {"valid"} else "maybe"
            return Mutation(f"config {key}=grid {good!r}", data, _key_names(key), verdict)
        return Mutation(f"config {key}={config[key]!r}", data, _key_names(key), "invalid")
    if kind == "experiment":
        return _mutate_experiment(data, name, exp, rng, base_ok)
    # wrong top-level shapes
    top = rng.randrange(7)
    if top == 0:
        return Mutation("top level a list", [exp], ["experiment"], "invalid")
    if top == 1:
        return Mutation("top level a string", "just text", ["experiment"], "invalid")
    if top == 2:
        return Mutation("top level null", None, ["experiment"], "invalid")
    if top == 3:
        return Mutation("top level empty", {}, ["experiment"], "invalid")
    if top == 4:
        data[name] = rng.choice([None, [exp], "x", 5])
        return Mutation(f"experiment {data[name]!r}", data, [name], "invalid")
    if top == 5:
        bad_name = rng.choice([5, "", "a/b", True])
        return Mutation(f"experiment name {bad_name!r}", {bad_name: exp}, ["name"], "invalid")
    return Mutation("experiment without run", {name: {"config": config}}, ["run"], "invalid")


def _mutate_experiment(data, name, exp, rng, base_ok) -> Mutation:
    key = rng.choice(sorted(EXPERIMENT_KEYS) + ["unknown"])
    valid = "valid" if base_ok else "maybe"
    if key == "unknown":
        bad = rng.choice(["stopp", "checkpoint", "configs", "num_samples", "resources"])
        exp[bad] = rng.choice([1, {"a": 1}, None])
        return Mutation(f"experiment key {bad}", data, [bad], "invalid")
    if rng.random() < 0.15:
        if key == "run":
            verdict = "invalid"
        elif key in ("env", "config"):
            verdict = "maybe"  # the default env / the default config
        else:
            verdict = valid
        exp.pop(key, None)
        return Mutation(f"removed experiment {key}", data, [key], verdict)
    cases: dict[str, list[tuple[Any, str]]] = {
        "run": [("PPO", "invalid"), (5, "invalid"), (None, "invalid"), (["StarPO"], "invalid"),
                ("StarPO", valid)],
        "env": [(5, "invalid"), (None, "invalid"), ("ragen/Nope-v0", "invalid"),
                ({"a": 1}, "invalid"), ([1], "invalid"), (rng.choice(ENV_IDS), "maybe"),
                ({"grid_search": list(ENV_IDS[:2])}, "maybe"), ({"grid_search": []}, "invalid")],
        "stop": [("100", "invalid"), (100, "invalid"), ([1], "invalid"),
                 ({"training_iteration": "x"}, "invalid"),
                 ({"training_iteration": float("nan")}, "invalid"),
                 ({"training_iteration": float("inf")}, "invalid"),
                 ({"training_iteration": True}, "invalid"),
                 ({"training_iteration": {"a": 1}}, "invalid"),
                 ({"training_iteration": None}, "invalid"),
                 ({"training_iteration": {"grid_search": [1, 2]}}, "invalid"),
                 (None, valid), ({"training_iteration": 5}, valid),
                 ({"time_total_s": 10.5, "rollout/success_rate": 0.9}, valid)],
        "checkpoint_config": [("x", "invalid"), (5, "invalid"), ([1], "invalid"),
                              ({"checkpoint_frequency": "x"}, "invalid"),
                              ({"checkpoint_frequency": 1.5}, "invalid"),
                              ({"checkpoint_frequency": -1}, "invalid"),
                              ({"checkpoint_frequency": True}, "invalid"),
                              ({"checkpoint_frequency": None}, "invalid"),
                              ({"checkpoint_frequency": float("nan")}, "invalid"),
                              ({"checkpoint_at_end": "yes"}, "invalid"),
                              ({"checkpoint_at_end": 1}, "invalid"),
                              ({"checkpoint_at_end": None}, "invalid"),
                              ({"num_to_keep": 0}, "invalid"), ({"num_to_keep": "x"}, "invalid"),
                              ({"num_to_keep": 1.5}, "invalid"), ({"bogus": 1}, "invalid"),
                              (None, valid), ({}, valid), ({"checkpoint_frequency": 5}, valid),
                              ({"num_to_keep": 2, "checkpoint_at_end": False}, valid)],
        "storage_path": [(5, "invalid"), ([], "invalid"), ({}, "invalid"), (True, "invalid"),
                         ("", "invalid"), (float("nan"), "invalid"), (None, valid),
                         ("/tmp/ragen-fuzz-results", valid)],
        "config": [([1], "invalid"), ("x", "invalid"), (5, "invalid"), (True, "invalid"),
                   (None, "maybe"), ({}, "maybe")],
    }  # fmt: skip
    value, verdict = rng.choice(cases[key])
    exp[key] = copy.deepcopy(value)
    return Mutation(f"experiment {key}={value!r}", data, [key], verdict)


# ----- running one mutation through the CLI ----------------------------------------
def run_cli(path: Path, extra_args: list[str]) -> tuple[int, str, float]:
    from ragen_rllib.cli import main

    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main(["train", "file", str(path), "--dry-run", *extra_args])
        except SystemExit as exc:  # argparse errors exit 2 themselves
            rc = exc.code if isinstance(exc.code, int) else 1
    return rc, out.getvalue() + err.getvalue(), time.perf_counter() - start


def _names(message: str, names: list[str]) -> bool:
    message = message.split(KEY_LISTING_HEADER)[0]  # not the list of every key
    return any(re.search(rf"(?<![\w]){re.escape(n)}(?![\w])", message) for n in names)


def _error_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.startswith("rllib: ")]
    return lines[-1] if lines else ""


def fuzz_example(example_path: Path, workdir: Path, n: int = MUTATIONS) -> dict[str, Any]:
    example = yaml.safe_load(example_path.read_text())
    path = workdir / f"fuzz-{example_path.stem}.yaml"
    path.write_text(yaml.safe_dump(example))
    base_rc, base_out, base_time = run_cli(path, [])
    assert "Traceback" not in base_out, base_out
    if example_path.stem.endswith("_starpo"):  # a GPU and a hub model: fail fast here
        assert base_rc == 2 and base_time < SECONDS_PER_MUTATION, (base_rc, base_time)
        assert _names(_error_line(base_out), ["llm", "num_gpus_per_learner"]), base_out
    base_ok = base_rc == 0
    rng = random.Random(zlib.crc32(example_path.name.encode()))
    tally = {"invalid": 0, "accepted": 0, "rejected_named": 0, "maybe_rejected": 0}
    tally["does_not_fit"] = 0
    failures, slowest = [], 0.0
    for i in range(n):
        m = mutate(example, rng, base_ok)
        path.write_text(m.data if isinstance(m.data, str) else yaml.safe_dump(m.data))
        try:
            rc, output, seconds = run_cli(path, m.extra_args)
        except Exception as exc:  # noqa: BLE001 - a defect: reported below
            failures.append(f"#{i} {m.what}: {type(exc).__name__} escaped main: {exc}")
            continue
        slowest = max(slowest, seconds)
        error = _error_line(output)
        # A dry run whose plan does not fit this machine exits 1 and names the knob to
        # turn: the values were accepted, the memory verdict is the plan's (a change
        # such as a longer max_context_tokens can make a real model's update too big).
        too_big = rc == 1 and "a device does not fit" in output and "to fit:" in output
        if too_big and m.verdict != "invalid":
            tally["does_not_fit"] += 1
            continue
        problem = None
        if "Traceback" in output:
            problem = "a traceback in the output"
        elif seconds > SECONDS_PER_MUTATION:
            problem = f"took {seconds:.1f} s"
        elif rc not in (0, 2):
            problem = f"exit code {rc}"
        elif m.verdict == "invalid" and rc != 2:
            problem = "a surely invalid value was accepted"
        elif m.verdict == "valid" and rc != 0:
            problem = "a valid value was rejected"
        elif rc == 2 and m.verdict == "invalid" and not _names(error, m.names):
            problem = f"the error does not name {m.names}"
        elif rc == 2 and not _names(error, m.names + sorted(ALL_KEY_NAMES) + ["experiment"]):
            problem = "the error names no key"
        if problem:
            failures.append(f"#{i} {m.what} [{m.verdict}]: {problem}; rc={rc}: {output[-600:]}")
            continue
        if m.verdict == "invalid":
            tally["invalid"] += 1
        elif rc == 0:
            tally["accepted"] += 1
        else:
            tally["maybe_rejected"] += 1
        tally["rejected_named"] += rc == 2
    tally.update(mutations=n, failures=len(failures), slowest_s=round(slowest, 3))
    return {"tally": tally, "failures": failures}


def _report(name: str, tally: dict[str, Any]) -> str:
    return (
        f"{name}: {tally['mutations']} mutations, {tally['accepted']} accepted, "
        f"{tally['rejected_named']} rejected naming the key ({tally['invalid']} surely "
        f"invalid, {tally['maybe_rejected']} possibly valid), {tally['does_not_fit']} "
        f"planned too big for this machine, {tally['failures']} failures, "
        f"slowest {tally['slowest_s']} s"
    )


@pytest.fixture(scope="session")
def builtin_model(model_cache):
    """Build (or find) the built-in models once, and convert the real model's GGUF file
    where its wheel is installed, so each mutation is fast."""
    from ragen_rllib.models.resolve import resolve_model

    with contextlib.suppress(FileNotFoundError, ImportError):
        resolve_model("smollm2-135m-instruct")
    return resolve_model("builtin"), resolve_model("builtin-raw")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_fuzzed_tuned_example_fails_cleanly_naming_the_key(example, tmp_path, builtin_model):
    result = fuzz_example(example, tmp_path)
    print("\n" + _report(example.name, result["tally"]))
    assert not result["failures"], "\n".join(result["failures"][:10])


def test_the_fuzzer_covers_every_example():
    assert {p.stem for p in EXAMPLES} >= {
        "bandit_cpu", "bandit_starpo", "frozenlake_cpu", "frozenlake_starpo",
        "sokoban_cpu", "sokoban_starpo", "mix_cpu",
    }  # fmt: skip


if __name__ == "__main__":  # the tally without pytest: python tests/test_config_fuzz.py
    import sys
    import tempfile

    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for example in EXAMPLES:
            result = fuzz_example(example, Path(tmp))
            print(_report(example.name, result["tally"]), flush=True)
            for failure in result["failures"][:20]:
                print("  ", failure)
            bad += bool(result["failures"])
    sys.exit(1 if bad else 0)
