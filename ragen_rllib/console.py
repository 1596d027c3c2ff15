"""What a run prints: third-party notices that tell this project's user nothing are
kept off the console, each named here with the reason.

Everything else Ray, RLlib, torch and transformers log stays. :func:`quiet` is
idempotent and runs in each process that does this project's work, since each
logs on its own: at the import of the RL module (which the driver, Tune's trial
actor and the learner actors all import) and of the env runner (the rollout
actors, which import no learner code). :func:`no_progress_bars` wraps this
project's own model loads.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Iterator

_quieted = False


class DropMessages(logging.Filter):
    """Drops a logger's records whose message contains one of ``fragments``."""

    def __init__(self, *fragments: str):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(f in message for f in self.fragments)


class _DropPlain(DropMessages):
    """Drops records that are exactly ``fragment`` or start with it and say nothing more
    of use (the dashboard's address, when Ray adds it, keeps its line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith(self.fragments) and "dashboard" not in message)


def quiet() -> None:
    global _quieted
    if _quieted:
        return
    _quieted = True
    from ray.util.debug import log_once

    # RLlib warns once per process that an algorithm runs on the new API stack, its
    # default, and how to switch back; StarPO exists only on that stack.
    log_once("StarPO_on_new_api_stack")
    # Ray 2.60's RLModule.__init__ builds a deprecated RLModuleConfig for every module
    # and warns about it; this project's modules pass only the new arguments.
    logging.getLogger("ray._common.deprecation").addFilter(DropMessages("RLModuleConfig object"))
    # A new local cluster turns token authentication on and says so (and, the first
    # time in a HOME, that it made the token): the safe default, nothing to act on.
    # (The warning that it is off stays.)
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        DropMessages("Token authentication is enabled", "Generated new authentication token")
    )
    # Tune's and Train's bookkeeping, said at INFO level on every run: a slow trainable
    # setup (an LLM's is always slow; reuse_actors does not apply to one trial), each
    # checkpoint's path (the run's last lines name it) and each state snapshot.
    # (Ray's start says where its dashboard is when there is one: only the plain
    # notice is dropped.)
    for name, fragment in (
        ("ray.tune.trainable.trainable", "Trainable.setup took"),
        ("ray.train._internal.storage", "Checkpoint successfully created at"),
        ("ray.tune.tune", "Wrote the latest version of all result files"),
        ("ray._private.worker", "Started a local Ray instance."),
    ):
        logging.getLogger(name).addFilter(_DropPlain(fragment))
    import torch

    if not torch.cuda.is_available():
        # Tune's system-usage monitor asks for GPUtil on a machine with no GPU.
        logging.getLogger("ray.tune.utils.util").addFilter(DropMessages("Install gputil"))


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers draws no progress bar inside (loading, dequantising, saving): the
    console gets this project's one-line log messages instead."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    # The GGUF reader draws its own tqdm bar, which that switch does not reach.
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - an older or newer transformers
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_on:
            hf_logging.enable_progress_bar()
