"""The built-in model: a tiny Qwen2 causal LM over the environments' words, shipped
with the package, and its cache.

It plays the part of a pretrained LLM so that everything runs with no download:
it reads the environments' texts (symbols, grids, what actions do, the answer
format) and knows no good policy, so reinforcement learning has the same job as
with a real model. It is a standard Hugging Face directory (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json with a ChatML chat
template, generation_config.json) that ``AutoTokenizer`` /
``AutoModelForCausalLM.from_pretrained`` (and vLLM) load like any checkpoint;
the learner, the env runners and the rollout engines only ever see its path.

The default build (``llm: builtin``) ships in ``builtin/weights/`` with a
record of how it was made (:mod:`ragen_rllib.builtin.build`); any other build
(another seed or spec, or ``builtin-raw`` without pretraining) is made on first
use into the cache. Its tokenizer is :mod:`ragen_rllib.builtin.tokenizer`'s, its
pretraining :mod:`ragen_rllib.builtin.pretraining`'s; the pretrained model
succeeds about as often as a random agent (``bench/bench_no_policy.py``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from ragen_rllib.builtin.pretraining import pretrain
from ragen_rllib.builtin.spec import BUILD_VERSION, BuiltinSpec
from ragen_rllib.builtin.tokenizer import build_tokenizer, build_vocab

logger = logging.getLogger(__name__)

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
#: The shipped build's directory, and the record of how it was made.
PACKAGED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")
INFO_FILE = "build_info.json"


def build_model(tokenizer: Any, spec: BuiltinSpec, seed: int) -> Any:
    """A freshly initialised Qwen2 causal LM (deterministic for ``seed``)."""
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        max_window_layers=spec.num_hidden_layers,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


def file_digests(path: str) -> dict[str, str]:
    """sha256 of every file of a model directory except the build record."""
    out = {}
    for name in sorted(os.listdir(path)):
        full = os.path.join(path, name)
        if name != INFO_FILE and os.path.isfile(full):
            with open(full, "rb") as f:
                out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


def packaged_model(key: str, path: str = PACKAGED_DIR) -> str | None:
    """``path`` when it holds the build whose key is ``key`` with intact files, else None.

    A stale build (another key) is logged and skipped, so the caller builds
    the current one; a file whose hash differs from the record raises, since
    the shipped weights were damaged.
    """
    info_path = os.path.join(path, INFO_FILE)
    if not os.path.isfile(info_path):
        return None
    with open(info_path) as f:
        info = json.load(f)
    if info.get("key") != key:
        logger.warning(
            "the packaged built-in model %s was built by other code (key %s, this code %s); "
            "building the current one instead (rebuild with python -m ragen_rllib.builtin.build)",
            path,
            info.get("key"),
            key,
        )
        return None
    found = file_digests(path)
    if found != info.get("sha256"):
        bad = sorted(
            n for n in set(found) | set(info["sha256"]) if found.get(n) != info["sha256"].get(n)
        )
        raise RuntimeError(
            f"the packaged built-in model in {path} is damaged: {bad} do not match the sha256 in "
            f"{INFO_FILE}; reinstall ragen-rllib or run python -m ragen_rllib.builtin.build"
        )
    return path



def cached_model_dir(name: str, pretrained: bool, seed: int, spec: BuiltinSpec, cache: str) -> str:
    """Where :func:`get_builtin_model` keeps a build in the ``cache`` folder (it may not
    exist yet): the name, then the build's key."""
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ValueError(f"builtin model name must match {_NAME_RE.pattern}, got {name!r}")
    return os.path.join(cache, f"{name}-{build_key(pretrained, seed, spec)}")


def build_key(pretrained: bool, seed: int, spec: BuiltinSpec) -> str:
    """Digest of every build parameter, the vocabulary and :data:`BUILD_VERSION`."""
    key = {
        "build_version": BUILD_VERSION,
        "pretrained": bool(pretrained),
        "seed": int(seed),
        "spec": asdict(spec),
        "vocab": build_vocab(spec.corpus_seeds),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def get_builtin_model(
    name: str = "builtin",
    *,
    pretrained: bool = True,
    seed: int = 0,
    cache_dir: str,
    spec: BuiltinSpec | None = None,
) -> str:
    """Path of the built-in model's Hugging Face directory, building it on first use.

    The default pretrained build (``builtin``, seed 0, default spec) ships with
    the package (:data:`PACKAGED_DIR`, see :mod:`ragen_rllib.builtin.build`)
    and is returned as it is when its recorded key matches this code. Any other
    build goes to the cache; its folder name hashes every build parameter, the
    vocabulary and :data:`BUILD_VERSION`. A build happens in a temporary folder that is then
    renamed into place, so concurrent builders never see half a model.
    """
    spec = spec or BuiltinSpec()
    if name == "builtin" and pretrained:
        shipped = packaged_model(build_key(True, seed, spec))
        if shipped is not None:
            return shipped
    final = cached_model_dir(name, pretrained, seed, spec, cache_dir)
    if os.path.isdir(final):
        return final
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(final)}-", dir=parent)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # bitwise reproducible float sums
    try:
        start = time.perf_counter()
        logger.info(
            "building the built-in model %s (once; %s)",
            final,
            f"{spec.pretrain_steps} pretraining steps, minutes on a CPU"
            if pretrained
            else "seconds",
        )
        tokenizer = build_tokenizer(*build_vocab(spec.corpus_seeds))
        model = build_model(tokenizer, spec, seed)
        if pretrained:
            pretrain(model, tokenizer, spec, seed)
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        try:
            os.replace(tmp, final)
        except OSError:
            if not os.path.isdir(final):  # not a lost race with another builder
                raise
        logger.info("built %s in %.1f s", final, time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return final
