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
