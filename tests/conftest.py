"""Test-wide settings: the built-in model is cached in one temporary folder per session,
so tests never read or write the user's ~/.cache."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def model_cache(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("model-cache"))
    old = os.environ.get("RAGEN_RLLIB_CACHE")
    os.environ["RAGEN_RLLIB_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("RAGEN_RLLIB_CACHE", None)
    else:
        os.environ["RAGEN_RLLIB_CACHE"] = old


def pytest_collection_modifyitems(config, items):
    """Tests marked `vllm` need vLLM, which has its own install (the README's vLLM
    test command). Without it they are skipped, or fail when RAGEN_REQUIRE_VLLM=1."""
    import importlib.util

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
