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
from conftest import absolute_imports

import ragen_rllib

ROOT = Path(ragen_rllib.__file__).parent
#: The most lines a package file may have: a bound on a file holding two jobs, far
#: above what a file of one job needs (the design is driven by functions' length).
MAX_LINES = 800
#: The most lines a function may have, its docstring included.
MAX_FUNCTION_LINES = 60
#: The functions longer than MAX_FUNCTION_LINES today, with their length. The list
#: only shrinks: a listed function may not grow, one that fits the bound must leave
#: the list, and no other function may pass the bound.
LONG_FUNCTIONS = {
    "ragen_rllib/cli/train.py:train": 127,
    "ragen_rllib/cli/__init__.py:build_parser": 119,
    "ragen_rllib/planning/placement.py:plan": 115,
    "ragen_rllib/engines/hf_engine.py:HFEngine._generate_batch": 113,
    "envs/qa/search_world.py:generate_world": 111,
    "ragen_rllib/learner/starpo_learner.py:StarPOTorchLearner.optimizer_step": 98,
    "ragen_rllib/agents/gateway.py:Gateway._answer": 95,
    "ragen_rllib/learner/loss.py:starpo_loss": 81,
    "ragen_rllib/agents/gateway_request.py:read_request": 80,
    "ragen_rllib/learner/policy_losses.py:policy_loss": 71,
    "ragen_rllib/builtin/pretraining.py:pretrain": 71,
    "ragen_rllib/models/gguf.py:convert_gguf": 70,
    "ragen_rllib/cli/evaluate.py:evaluate": 69,
    "ragen_rllib/builtin/quality.py:format_valid_by_env": 69,
    "ragen_rllib/agents/gateway_app.py:make_app": 69,
    "envs/core/base.py:TextEnv.__init__": 69,
    "ragen_rllib/algorithms/starpo/config/yaml_front.py:config_from_user_dict": 68,
    "ragen_rllib/agents/gateway_guard.py:guarded_protocol": 68,
    "ragen_rllib/engines/vllm_engine.py:VLLMEngine.__init__": 67,
    "ragen_rllib/cli/experiments.py:build_config": 65,
    "ragen_rllib/maths/advantages.py:gigpo_advantages": 64,
    "ragen_rllib/maths/advantages.py:bilevel_gae": 64,
    "envs/puzzles/sudoku_solver.py:count_solutions": 64,
    "ragen_rllib/maths/collapse.py:pair_information": 62,
    "ragen_rllib/planning/memory.py:learner_lines": 61,
}
#: folder -> the folders its modules import ("root": ragen_rllib/__init__.py, "console":
#: ragen_rllib/console.py, "ragen_envs": the env package, which imports nothing of
#: ragen_rllib). Lowest first; the table has no loop, so neither can the folders, and it
#: holds exactly the edges the code uses: a new edge is a decision made here, and an
#: edge no longer used is taken out.
FOLDER_IMPORTS: dict[str, set[str]] = {
    "records": set(),
    "maths": set(),
    "chat": set(),
    "console": set(),
    "distributed": set(),
    "env_choice": {"chat", "ragen_envs"},
    "builtin": {"chat", "ragen_envs"},
    "models": {"builtin", "console"},
    "warmup": {"builtin", "chat", "console", "env_choice", "models"},
    "planning": {"maths", "models"},
    "engines": {"console", "maths", "models", "planning"},
    "agents": {"chat", "engines", "records"},
    "rl_module": {"console", "distributed", "maths", "models"},
    "learner": {"console", "distributed", "maths", "records", "rl_module"},
    "connectors": {"maths", "records"},
    "env_runner": {
        "agents",
        "chat",
        "console",
        "distributed",
        "engines",
        "env_choice",
        "maths",
        "models",
        "records",
        "warmup",
    },  # fmt: skip
    "algorithms": {
        "agents",
        "chat",
        "connectors",
        "distributed",
        "engines",
        "env_choice",
        "env_runner",
        "learner",
        "maths",
        "models",
        "planning",
        "records",
        "rl_module",
        "warmup",
    },  # fmt: skip
    "root": {"algorithms"},
    "cli": {
        "agents",
        "algorithms",
        "distributed",
        "env_choice",
        "env_runner",
        "models",
        "planning",
        "records",
        "root",
    },  # fmt: skip
    "ragen_envs": set(),
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


def imports_env_package(name: str) -> bool:
    """Whether module ``name`` imports the env package (``ragen_envs``) anywhere."""
    return any(t.split(".")[0] == "ragen_envs" for t in absolute_imports(MODULES[name]))


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


def test_folders_import_exactly_the_folders_their_row_names():
    folders = folder_graph(GRAPH)
    for name in MODULES:
        if imports_env_package(name):
            folders[folder_of(name)].add("ragen_envs")
    folders["ragen_envs"] = set()  # checked below: it imports nothing of ragen_rllib
    assert set(folders) == set(FOLDER_IMPORTS), "a folder without a row in FOLDER_IMPORTS"
    assert find_cycle(FOLDER_IMPORTS) is None, " -> ".join(find_cycle(FOLDER_IMPORTS))
    for folder, deps in folders.items():
        assert deps <= FOLDER_IMPORTS[folder], (
            "new edge",
            folder,
            sorted(deps - FOLDER_IMPORTS[folder]),
        )
        assert deps >= FOLDER_IMPORTS[folder], (
            "unused edge",
            folder,
            sorted(FOLDER_IMPORTS[folder] - deps),
        )
    assert find_cycle(folders) is None


FLOORS_START, FLOORS_END = "<!-- folder-imports -->", "<!-- /folder-imports -->"


def floors() -> dict[str, int]:
    """Each folder's floor: 1 for a folder that imports nothing, else one above the
    highest folder it imports."""
    out: dict[str, int] = {}

    def floor(folder: str) -> int:
        if folder not in out:
            out[folder] = 1 + max((floor(d) for d in FOLDER_IMPORTS[folder]), default=0)
        return out[folder]

    for folder in FOLDER_IMPORTS:
        floor(folder)
    return out


def folder_table() -> str:
    """The markdown table of FOLDER_IMPORTS, top floor first, as docs/architecture.md
    holds it between its folder-imports markers."""
    level = floors()
    order = sorted(FOLDER_IMPORTS, key=lambda f: (-level[f], f))
    names = {
        "root": "`__init__.py`",
        "console": "`console.py`",
        "ragen_envs": "`ragen_envs` (envs/)",
    }
    lines = ["| floor | folder | imports |", "|---|---|---|"]
    for f in order:
        deps = ", ".join(names.get(d, f"`{d}/`") for d in sorted(FOLDER_IMPORTS[f])) or "nothing"
        lines.append(f"| {level[f]} | {names.get(f, f'`{f}/`')} | {deps} |")
    return "\n".join(lines)


TREE_START, TREE_END = "<!-- file-tree -->", "<!-- /file-tree -->"


def file_tree() -> str:
    """Every package file, one line each (its docstring's first line), folder by
    folder from the top floor down, as docs/architecture.md holds it."""
    level = floors()
    by_folder: dict[str, list[str]] = {}
    for name, path in sorted(MODULES.items()):
        rel = path.relative_to(ROOT).as_posix()
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        first = " ".join(doc.split("\n\n", 1)[0].split())
        first = first if len(first) <= 110 else first[:107].rsplit(" ", 1)[0] + " ..."
        by_folder.setdefault(folder_of(name), []).append(f"{rel:<44} {first}")
    out = ["```"]
    for folder in sorted(by_folder, key=lambda f: (-level.get(f, 0), f)):
        out += by_folder[folder]
    out.append("```")
    return "\n".join(out)


def test_the_architecture_docs_file_tree_is_the_package():
    """Regenerate with ``python tests/test_layout.py``."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    held = doc.split(TREE_START, 1)[1].split(TREE_END, 1)[0].strip()
    assert held == file_tree(), "run: python tests/test_layout.py"


def test_the_architecture_docs_folder_table_is_folder_imports():
    """Regenerate with ``python tests/test_layout.py`` after changing the table."""
    doc = (ROOT.parent / "docs" / "architecture.md").read_text()
    held = doc.split(FLOORS_START, 1)[1].split(FLOORS_END, 1)[0].strip()
    assert held == folder_table(), "run: python tests/test_layout.py"


def test_the_env_package_imports_nothing_of_ragen_rllib():
    envs = ROOT.parent / "envs"
    for path in envs.rglob("*.py"):
        bad = [n for n in absolute_imports(path) if n.split(".")[0] == "ragen_rllib"]
        assert not bad, (path.relative_to(envs).as_posix(), bad)


def test_the_trajectory_records_old_path_still_unpickles():
    """Checkpoints pickle their buffered trajectories; one pickled when the record
    lived in env_runner/ restores as the same class."""
    from ragen_rllib.records.trajectory import Trajectory

    # protocol 2 writes class paths as text lines, which a byte replace can rename
    blob = pickle.dumps(Trajectory(env_id="x", seed=1, group=2), protocol=2)
    old = blob.replace(b"ragen_rllib.records.trajectory", b"ragen_rllib.env_runner.trajectory")
    assert old != blob
    back = pickle.loads(old)
    assert type(back) is Trajectory and (back.seed, back.group) == (1, 2)


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


def function_lengths(path: Path, rel: str) -> dict[str, int]:
    """``rel:Class.function`` -> its lines (docstring included), for every function
    and method of the file at ``path``, nested ones too."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                out[f"{rel}:{prefix}{child.name}"] = child.end_lineno - child.lineno + 1
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(path.read_text()), "")
    return out


def test_functions_stay_short_and_the_list_of_long_ones_only_shrinks():
    lengths: dict[str, int] = {}
    repo = ROOT.parent
    for path in [*ROOT.rglob("*.py"), *(repo / "envs").rglob("*.py")]:
        lengths.update(function_lengths(path, path.relative_to(repo).as_posix()))
    new = {f: n for f, n in lengths.items() if n > MAX_FUNCTION_LINES and f not in LONG_FUNCTIONS}
    assert not new, f"functions over {MAX_FUNCTION_LINES} lines: split them ({new})"
    for name, allowed in LONG_FUNCTIONS.items():
        assert name in lengths, f"{name} is gone: take it out of LONG_FUNCTIONS"
        assert lengths[name] <= allowed, f"{name} grew to {lengths[name]} lines ({allowed})"
        assert lengths[name] > MAX_FUNCTION_LINES, (
            f"{name} is {lengths[name]} lines now: take it out of LONG_FUNCTIONS"
        )


def test_the_function_guard_counts_a_function_whole(tmp_path):
    source = tmp_path / "m.py"
    source.write_text(
        'class A:\n    def f(self):\n        """doc"""\n\n        return 1\n\n\n'
        "def g():\n    def h():\n        pass\n\n    return h\n"
    )
    assert function_lengths(source, "m.py") == {"m.py:A.f": 4, "m.py:g": 5, "m.py:g.h": 2}


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


def _rewrite(text: str, start: str, end: str, block: str) -> str:
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{block}\n{end}{rest.split(end, 1)[1]}"


if __name__ == "__main__":  # rewrite docs/architecture.md's folder table and file tree
    path = ROOT.parent / "docs" / "architecture.md"
    text = _rewrite(path.read_text(), FLOORS_START, FLOORS_END, folder_table())
    path.write_text(_rewrite(text, TREE_START, TREE_END, file_tree()))
    print(f"wrote the folder table and the file tree of {path}")


def test_a_checkpoint_naming_a_moved_module_is_refused_with_both_paths(tmp_path):
    from ragen_rllib.algorithms.starpo.checkpoint import (
        MOVED_MODULES,
        OldLayoutCheckpointError,
        verify_checkpoint,
        write_manifest,
    )

    for old, new in MOVED_MODULES.items():
        # the move is real (env_runner.self_play is now the package of the new paths)
        assert new in MODULES and MODULES.get(old, ROOT).name in ("ragen_rllib", "__init__.py")
    _Old.__module__, _Old.__qualname__ = "ragen_rllib.env_choice.opponents", "OpponentSetup"
    fake = types.ModuleType(_Old.__module__)
    fake.OpponentSetup = _Old
    sys.modules[_Old.__module__] = fake
    try:
        blob = pickle.dumps({"opponent_setup": _Old()})
    finally:
        del sys.modules["ragen_rllib.env_choice.opponents"]
    (tmp_path / "class_and_ctor_args.pkl").write_bytes(blob)
    write_manifest(tmp_path)
    with pytest.raises(OldLayoutCheckpointError, match="env_choice.opponents.*self_play.seats"):
        verify_checkpoint(tmp_path)
