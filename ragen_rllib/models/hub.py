"""Hugging Face hub ids for ``llm``: load a model's config in seconds, or say why not.

The config check runs before Ray starts; a hub id that cannot be loaded must fail
there, quickly, and not after minutes of retries inside a Ray actor. A hub id is
tried from the local cache first; if it is not cached, the hub being switched off
(``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE``) or not answering a short TCP probe
fails at once, and only a reachable hub is asked, within a deadline.
"""

from __future__ import annotations

import os
import socket
import threading

_HUB_PROBE_TIMEOUT_S = 3.0  # a TCP connect to the hub endpoint, name lookup included
_HUB_LOAD_TIMEOUT_S = 20.0  # loading a hub model's config once the hub answered the probe
_hub_reachable_cache: dict[str, bool] = {}


def _truthy_env(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """Whether the Hugging Face hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    if _truthy_env("HF_HUB_OFFLINE") or _truthy_env("TRANSFORMERS_OFFLINE"):
        return True
    try:
        from huggingface_hub import constants

        return bool(constants.HF_HUB_OFFLINE)
    except ImportError:  # pragma: no cover - transformers depends on it
        return False


def hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_reachable(endpoint: str | None = None, timeout: float = _HUB_PROBE_TIMEOUT_S) -> bool:
    """One TCP connect to the hub endpoint (or the HTTPS proxy), within `timeout` seconds
    (name resolution included); the answer is cached for the process."""
    from urllib.parse import urlsplit

    endpoint = endpoint or hub_endpoint()
    if endpoint in _hub_reachable_cache:
        return _hub_reachable_cache[endpoint]
    url = urlsplit(endpoint)
    proxy = next(
        (
            os.environ[n]
            for n in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
            if os.environ.get(n)
        ),
        None,
    )
    no_proxy = os.environ.get("NO_PROXY") or os.environ.get("no_proxy") or ""
    if proxy and not any(
        h.strip() and (url.hostname or "").endswith(h.strip().lstrip("*"))
        for h in no_proxy.split(",")
    ):
        url = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
    host = url.hostname
    port = url.port or (443 if url.scheme == "https" else 80)
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except (OSError, ValueError):
            result.append(False)

    if host:
        thread = threading.Thread(target=probe, daemon=True, name="hub-probe")
        thread.start()
        thread.join(timeout + 0.5)  # a hanging name lookup counts as unreachable
    reachable = bool(result and result[0])
    _hub_reachable_cache[endpoint] = reachable
    return reachable


def load_hub_config(llm: str) -> None:
    """Load a hub model's config: from the local cache, else (hub reachable) within a
    deadline. Raises FileNotFoundError naming `llm` in seconds when it cannot."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    what = (
        f"config llm={llm!r} is invalid: it must be 'builtin', 'builtin-raw', a local "
        "model directory or a Hugging Face hub id such as 'Qwen/Qwen2.5-0.5B-Instruct'"
    )
    try:
        validate_repo_id(llm)
    except HFValidationError as err:
        raise FileNotFoundError(
            f"{what}; it is not a local directory, nor a hub id: {err}"
        ) from err
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(llm, local_files_only=True)
        return
    except OSError:
        pass  # not in the local cache
    except Exception as err:  # noqa: BLE001 - a cached but unusable config
        raise FileNotFoundError(f"{what}; its cached config does not load: {err}") from err
    if hub_offline():
        raise FileNotFoundError(
            f"{what}; {llm!r} is not a local directory and not in the local Hugging Face "
            "cache, and the hub is switched off (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is "
            "set). Download the model and set llm to its directory"
        )
    endpoint = hub_endpoint()
    if not hub_reachable(endpoint):
        raise FileNotFoundError(
            f"{what}; {llm!r} is not a local directory and not in the local Hugging Face "
            f"cache, and the hub ({endpoint}) is unreachable from here (offline?). "
            "Download the model and set llm to its directory, or set HF_ENDPOINT"
        )
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            AutoConfig.from_pretrained(llm)
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - reported below
            outcome.append(err)

    thread = threading.Thread(target=load, daemon=True, name="hub-config")
    thread.start()
    thread.join(_HUB_LOAD_TIMEOUT_S)
    if not outcome:
        raise FileNotFoundError(
            f"{what}; loading its config from {endpoint} took over "
            f"{_HUB_LOAD_TIMEOUT_S:g} s (hub slow or unreachable?)"
        )
    if outcome[0] is not None:
        err = outcome[0]
        raise FileNotFoundError(
            f"config llm={llm!r} is neither a local model directory nor a hub model that "
            f"can be loaded here: {type(err).__name__}: {err}"
        ) from err
