"""The flat module paths of earlier releases (``ragen_envs.sokoban``), kept working.

The envs live in family folders (``ragen_envs.grids.sokoban``); code, entry points
and pickled objects that name a flat path get the module at its new path, and
``python -m`` runs it under its old name too. Nothing is imported until asked.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module name -> new module name.
MOVED = {
    f"ragen_envs.{old}": f"ragen_envs.{new}"
    for old, new in {
        "base": "core.base",
        "parsing": "core.parsing",
        "answer_env": "core.answer_env",
        "sokoban": "grids.sokoban",
        "sokoban_gen": "grids.sokoban_gen",
        "sokoban_solver": "grids.sokoban_solver",
        "frozenlake": "grids.frozenlake",
        "game2048": "grids.game2048",
        "bandit": "puzzles.bandit",
        "countdown": "puzzles.countdown",
        "countdown_expr": "puzzles.countdown_expr",
        "sudoku": "puzzles.sudoku",
        "sudoku_solver": "puzzles.sudoku_solver",
        "dataset_qa": "qa.dataset_qa",
        "qa_answers": "qa.qa_answers",
        "qa_data": "qa.qa_data",
        "word_problems": "qa.word_problems",
        "search_qa": "qa.search_qa",
        "search_index": "qa.search_index",
        "search_world": "qa.search_world",
        "openenv_protocol": "remote.protocol",
        "serve": "remote.serve",
    }.items()
}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old name and loads it as the module at its new name (one module
    object under both names)."""

    def find_spec(self, name, path=None, target=None):
        if name not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec):
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module) -> None:
        """The module ran under its new name already."""

    def get_code(self, name):  # for `python -m ragen_envs.<old>`
        new = importlib.util.find_spec(MOVED[name])
        return new.loader.get_code(MOVED[name])


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())
