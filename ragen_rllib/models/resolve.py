"""Resolving a config's ``llm`` to what ``from_pretrained`` loads: every run starts here.

``builtin`` and ``builtin-raw`` are the built-in model with and without its
pretraining (:mod:`ragen_rllib.builtin.model`); a name of
:data:`~ragen_rllib.models.gguf.NAMED_GGUF` (``smollm2-135m-instruct``) or a
path to a ``.gguf`` file is converted once into a cached Hugging Face folder
(:mod:`ragen_rllib.models.gguf`); an existing local directory is used as it
is; anything else is taken for a Hugging Face hub id (checked before Ray starts
by :func:`ragen_rllib.models.hub.load_hub_config`).
"""

from __future__ import annotations

import os

from ragen_rllib.models.cache_folder import default_cache_dir
from ragen_rllib.models.gguf import NAMED_GGUF, convert_gguf, is_gguf_path, named_gguf_file

BUILTIN_NAMES = {"builtin": True, "builtin-raw": False}  # name -> pretrained


def resolve_model(name_or_path: str, *, cache_dir: str | None = None) -> str:
    """What ``from_pretrained`` should load for a config's ``llm`` value.

    ``"builtin"`` / ``"builtin-raw"`` build (or find) the built-in model with /
    without pretraining; a named GGUF model or a ``.gguf`` file gives its converted
    folder in the cache (converting it on first use); an existing local directory
    is returned (``~`` expanded); anything that looks like a local path but does
    not exist raises FileNotFoundError; anything else is taken for a hub id and
    returned unchanged.
    """
    if not isinstance(name_or_path, str) or not name_or_path.strip():
        raise ValueError(
            f"llm must be 'builtin', 'builtin-raw', {', '.join(map(repr, NAMED_GGUF))}, "
            f"a path or a hub id, got {name_or_path!r}"
        )
    if name_or_path in BUILTIN_NAMES:
        # Imported here: the built-in model's vocabulary is read from the env package's
        # texts, which resolving any other model does not load.
        from ragen_rllib.builtin.model import get_builtin_model

        return get_builtin_model(
            name_or_path,
            pretrained=BUILTIN_NAMES[name_or_path],
            cache_dir=cache_dir or default_cache_dir(),
        )
    if name_or_path in NAMED_GGUF:
        return convert_gguf(named_gguf_file(name_or_path), cache_dir or default_cache_dir())
    path = os.path.expanduser(name_or_path)
    if is_gguf_path(path):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"llm GGUF file {name_or_path!r} does not exist")
        return convert_gguf(path, cache_dir or default_cache_dir())
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
            f"or a .gguf file (or use 'builtin', 'builtin-raw', "
            f"{', '.join(map(repr, NAMED_GGUF))} or a hub id such as "
            "'Qwen/Qwen2.5-0.5B-Instruct')"
        )
    return name_or_path
