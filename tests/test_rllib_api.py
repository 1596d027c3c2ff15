"""The project's reach into RLlib beyond its public API is the list in
docs/architecture.md ("RLlib beyond its public API"): every RLlib method a
project class overrides under a leading-underscore name is on it, and nothing
else is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import ragen_rllib

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"


def private_overrides() -> set[tuple[str, str]]:
    """(RLlib's ``Class.method``, project file) for each underscore-named RLlib
    method that a project class (or a mixin of one) defines again. The RLlib class
    named is the most basic one that defines the method."""
    found = set()
    for info in pkgutil.walk_packages(ragen_rllib.__path__, "ragen_rllib."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            mro = cls.__mro__
            ours = [c for c in mro if c.__module__.startswith("ragen_rllib.")]
            theirs = [c for c in mro if c.__module__.startswith("ray.")]
            for own in ours:
                for name in own.__dict__:
                    method = own.__dict__[name]
                    if not name.startswith("_") or name.startswith("__"):
                        continue
                    if not callable(method) and not isinstance(method, property):
                        continue  # e.g. abc's _abc_impl
                    owners = [c for c in theirs if name in c.__dict__]
                    if owners:
                        path = Path(inspect.getfile(own)).resolve().relative_to(ROOT)
                        path = str(path).removeprefix("ragen_rllib/")
                        found.add((f"{owners[-1].__qualname__}.{name}", path))
    return found


def documented() -> set[tuple[str, str]]:
    text = DOC.read_text()
    block = text.split("<!-- rllib-private -->")[1].split("<!-- /rllib-private -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]+)` \|", block, flags=re.M)
    return {(name, path) for name, path in rows if name != "RLlib name"}


def test_the_private_rllib_overrides_are_the_documented_list():
    assert private_overrides() == documented()


def test_fewer_than_three_private_rllib_methods_are_overridden_beyond_rllibs_own_hooks():
    # RLModule._forward_train is RLlib's documented way to write a module; the
    # learner's two are RLlib's marked override points, kept as few as possible.
    learner_side = {name for name, _ in private_overrides() if not name.startswith("RLModule.")}
    assert len(learner_side) < 3, learner_side
