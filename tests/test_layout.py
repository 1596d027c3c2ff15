"""The package's layout: folders in layers (a table of which folder may import which,
with no loop between folders), no import circle between modules, rollout actors free
of learner code, short files of one job, and checkpoints of the old flat layout
refused with a clear message. No Ray."""

from __future__ import annotations

import ast
import pickle
import sys
import types
from pathlib import Path

import pytest

import ragen_rllib

ROOT = Path(ragen_rllib.__file__).parent
#: The most lines a package file may have: a policy, not the largest file's size.
MAX_LINES = 400
_BASE = {"maths", "chat", "console", "distributed"}  # import nothing of the project
#: folder -> the folders its modules may import ("root": ragen_rllib/__init__.py,
#: "console": ragen_rllib/console.py). Lowest first; the table has no loop, so
#: neither can the folders.
FOLDER_IMPORTS: dict[str, set[str]] = {
    "maths": set(),
    "chat": set(),
    "console": set(),
    "distributed": set(),
    "models": {"chat", "console"},
    "planning": {"models", "maths"},
    "engines": _BASE | {"models", "planning"},
    "env_runner": _BASE | {"models", "planning", "engines"},
    "rl_module": _BASE | {"models"},
    "learner": _BASE | {"models", "rl_module"},
    "connectors": _BASE | {"env_runner", "rl_module", "learner"},
    "algorithms": _BASE
    | {"models", "planning", "engines", "env_runner", "rl_module", "learner", "connectors"},
    "root": {"algorithms"},
    "cli": _BASE | {"root", "algorithms", "env_runner", "planning", "models", "engines"},
}


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


def folder_of(module: str) -> str:
    parts = module.split(".")
    return "root" if len(parts) == 1 else parts[1]


def folder_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Which folder imports which, from the module graph (a folder's own imports left out)."""
    out: dict[str, set[str]] = {}
    for name, deps in graph.items():
        here = folder_of(name)
        out.setdefault(here, set()).update(d for d in map(folder_of, deps) if d != here)
    return out


def test_folders_import_only_the_folders_below_them():
    folders = folder_graph(GRAPH)
    assert set(folders) == set(FOLDER_IMPORTS), "a folder without a row in FOLDER_IMPORTS"
    assert find_cycle(FOLDER_IMPORTS) is None, " -> ".join(find_cycle(FOLDER_IMPORTS))
    for folder, deps in folders.items():
        assert deps <= FOLDER_IMPORTS[folder], (folder, sorted(deps - FOLDER_IMPORTS[folder]))
    assert find_cycle(folders) is None


def test_a_loop_between_folders_is_found_though_no_module_circle_is():
    """models.a -> env_runner.b -> models.c: no module circle, a folder loop."""
    graph = {
        "ragen_rllib.models.a": {"ragen_rllib.env_runner.b"},
        "ragen_rllib.env_runner.b": {"ragen_rllib.models.c"},
        "ragen_rllib.models.c": set(),
    }
    assert find_cycle(graph) is None
    assert find_cycle(folder_graph(graph)) == ["env_runner", "models", "env_runner"]


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
        assert lines <= MAX_LINES, (rel, lines)
        assert ast.get_docstring(ast.parse(path.read_text())), (rel, "no module docstring")


def test_env_files_stay_short_too():
    envs = ROOT.parent / "envs"
    for path in envs.rglob("*.py"):
        lines = len(path.read_text().splitlines())
        assert lines <= MAX_LINES, (path.relative_to(envs).as_posix(), lines)


def test_setup_cfg_lists_every_package_folder():
    """setup.cfg lists packages by hand (envs/ installs as ragen_envs): a folder left
    out would be missing from a wheel, though an editable install hides it."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT.parent / "setup.cfg")
    listed = set(cfg["options"]["packages"].split())
    found = set()
    for top, name in ((ROOT, "ragen_rllib"), (ROOT.parent / "envs", "ragen_envs")):
        for init in top.rglob("__init__.py"):
            rel = init.parent.relative_to(top).parts
            found.add(".".join((name, *rel)))
    assert listed == found, (sorted(found - listed), sorted(listed - found))


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


def test_the_readmes_layout_table_is_the_package():
    """Every folder of ragen_rllib/ has a row in the README's layout table, and every
    row names a folder that exists (the table is checked, so it cannot go stale)."""
    import re

    readme = (ROOT.parent / "README.md").read_text()
    table = readme.split("<!-- layout -->", 1)[1].split("\n\n", 1)[0]
    rows = set(re.findall(r"^\| `([^`]+)/` \|", table, re.M))
    assert rows, "no layout table after <!-- layout --> in the README"
    folders = {f"ragen_rllib/{p.parent.name}" for p in ROOT.glob("*/__init__.py")}
    listed = {r for r in rows if r.startswith("ragen_rllib/")}
    assert listed == folders, (sorted(folders - listed), sorted(listed - folders))
    for row in rows:
        assert (ROOT.parent / row).is_dir(), row
    assert len(readme.encode()) <= 12 * 1024, "the README is for one sitting: 12 KB at most"


def test_the_walk_in_architecture_md_names_files_that_exist():
    """docs/architecture.md's walk from reset() to the loss: at most 15 files, each of
    them there, and no folder comes back but learner/ (minibatches before the RL
    module's forward pass, the loss after it)."""
    import re

    text = (ROOT.parent / "docs" / "architecture.md").read_text()
    walk = text.split("## The walk, file by file", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\d+) \| `([^`]+)/` \| `([^`]+)` \|", walk, re.M)
    assert 10 <= len(rows) <= 15, len(rows)
    assert [int(n) for n, _, _ in rows] == list(range(1, len(rows) + 1))
    for _, folder, file in rows:
        base = ROOT.parent if folder == "envs" else ROOT
        assert (base / folder / file).is_file(), f"{folder}/{file}"
    folders = [folder for _, folder, _ in rows]
    runs = [f for i, f in enumerate(folders) if i == 0 or folders[i - 1] != f]
    revisited = {f for f in runs if runs.count(f) > 1}
    assert revisited <= {"learner"}, revisited
