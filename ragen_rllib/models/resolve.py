"""Resolving a config's ``llm`` to what ``from_pretrained`` loads: every run starts here.

``builtin`` and ``builtin-raw`` are the built-in model with and without its
pretraining (:mod:`ragen_rllib.models.builtin`); an existing local directory is
used as it is; anything else is taken for a Hugging Face hub id (checked
before Ray starts by :func:`ragen_rllib.models.hub.load_hub_config`).
"""

from __future__ import annotations

import os

from ragen_rllib.models.builtin import get_builtin_model

BUILTIN_NAMES = {"builtin": True, "builtin-raw": False}  # name -> pretrained


def resolve_model(name_or_path: str, *, cache_dir: str | None = None) -> str:
    """What ``from_pretrained`` should load for a config's ``llm`` value.

    ``"builtin"`` / ``"builtin-raw"`` build (or find) the built-in model with /
    without pretraining; an existing local directory is returned (``~``
    expanded); anything that looks like a local path but does not exist raises
    FileNotFoundError; anything else is taken for a hub id and returned unchanged.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(
            f"llm must be 'builtin', 'builtin-raw', a path or a hub id, got {name_or_path!r}"
        )
    if name_or_path in BUILTIN_NAMES:
        return get_builtin_model(
            name_or_path, pretrained=BUILTIN_NAMES[name_or_path], cache_dir=cache_dir
        )
    path = os.path.expanduser(name_or_path)
    if os.path.isdir(path):
        return path
    parent = os.path.dirname(path)
    looks_like_path = (
        name_or_path.startswith(("/", "./", "../", "~"))
        or os.path.exists(path)
        or (parent != "" and os.path.isdir(parent))
        or name_or_path.count("/") > 1  # hub ids are "owner/name"
    )
    if looks_like_path:
        what = "is a file, not" if os.path.exists(path) else "does not exist; expected"
        raise FileNotFoundError(
            f"llm path {name_or_path!r} {what} a Hugging Face model directory "
            f"(or use 'builtin', 'builtin-raw' or a hub id such as 'Qwen/Qwen2.5-0.5B-Instruct')"
        )
    return name_or_path
