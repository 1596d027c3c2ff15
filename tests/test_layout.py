"""The package's layout: no import circle, rollout actors free of learner code, files of
one job, and checkpoints of the old flat layout refused with a clear message. No Ray."""

from __future__ import annotations

import ast
import pickle
import sys
import types
from pathlib import Path

import pytest

import ragen_rllib

ROOT = Path(ragen_rllib.__file__).parent
#: Files allowed past ~400 lines, each with the reason its docstring gives.
LONG_FILES = {"algorithms/starpo/starpo.py"}  # config and algorithm together, as RLlib does


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in ROOT.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """Every project module ``name`` imports, at the top or inside a function."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module pkg.mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]  # fmt: skip
        else:
            continue
        for target in targets:
            while target and target not in MODULES:  # `import a.b.c` of a module a.b
                target = target.rpartition(".")[0]
            if target.startswith("ragen_rllib") and target != name:
                found.add(target)
    return found


GRAPH = {name: imports_of(name) for name in MODULES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def reachable(start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in GRAPH[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_import_graph_has_no_circle():
    assert len(GRAPH) > 40 and sum(map(len, GRAPH.values())) > 80  # the graph was read
    assert find_cycle(GRAPH) is None, " -> ".join(find_cycle(GRAPH))


def test_the_cycle_finder_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_rollout_actors_import_no_learner_code():
    learner_side = ("learner", "rl_module", "connectors", "algorithms")
    for start in ("ragen_rllib.env_runner.llm_env_runner", "ragen_rllib.engines.vllm_engine"):
        pulled = reachable(start)
        assert "ragen_rllib.engines.base" in pulled  # the graph was followed
        bad = sorted(m for m in pulled if m.split(".")[1] in learner_side)
        bad += sorted(m for m in pulled if m in ("ragen_rllib.distributed.fsdp",))
        assert not bad, (start, bad)


def test_distributed_and_maths_import_nothing_above_them():
    for name, deps in GRAPH.items():
        if name.startswith("ragen_rllib.distributed"):
            assert not deps, (name, deps)
        if name.startswith("ragen_rllib.maths"):
            assert all(d.startswith("ragen_rllib.maths") for d in deps), (name, deps)


def test_files_hold_one_job_and_stay_short():
    for path in MODULES.values():
        lines = len(path.read_text().splitlines())
        rel = path.relative_to(ROOT).as_posix()
        if rel in LONG_FILES:
            doc = ast.get_docstring(ast.parse(path.read_text())) or ""
            assert "longer" in doc, (rel, "a long file says why in its docstring")
        else:
            assert lines <= 420, (rel, lines)
        assert ast.get_docstring(ast.parse(path.read_text())), (rel, "no module docstring")


def test_public_names_stay_importable():
    from ragen_rllib import StarPO, StarPOConfig, register_with_tune
    from ragen_rllib.algorithms.starpo import StarPO as S2

    assert StarPO is S2 and callable(register_with_tune)
    assert StarPOConfig().algo_class is StarPO


# ----- checkpoints of the flat layout ------------------------------------------------
class _Old:
    """Pickled under a module path of the flat layout."""


def test_a_checkpoint_of_the_flat_layout_is_refused_by_name(tmp_path):
    from ragen_rllib.algorithms.starpo.checkpoint import (
        OldLayoutCheckpointError,
        verify_checkpoint,
        write_manifest,
    )

    _Old.__module__ = "ragen_rllib.config"  # what a 0.1 checkpoint's config pickle names
    _Old.__qualname__ = "StarPOConfig"
    fake = types.ModuleType("ragen_rllib.config")
    fake.StarPOConfig = _Old
    sys.modules["ragen_rllib.config"] = fake
    try:
        blob = pickle.dumps(_Old())
    finally:
        del sys.modules["ragen_rllib.config"]
    (tmp_path / "class_and_ctor_args.pkl").write_bytes(blob)
    (tmp_path / "algorithm_state.pkl").write_bytes(pickle.dumps({"x": 1}))
    write_manifest(tmp_path)
    with pytest.raises(OldLayoutCheckpointError, match="ragen-rllib 0.1.*ragen_rllib.config"):
        verify_checkpoint(tmp_path)
    # The same files naming the new layout pass.
    _Old.__module__ = "ragen_rllib.algorithms.starpo.starpo"
    (tmp_path / "class_and_ctor_args.pkl").write_bytes(
        pickle.dumps(
            {
                "cls": "ragen_rllib.algorithms.starpo.starpo",
                "env": "ragen_rllib.env_runner.llm_env_runner",
            }
        )
    )
    write_manifest(tmp_path)
    verify_checkpoint(tmp_path)
