"""Text environments for multi-turn LLM agents (installed as ``ragen_envs``).

Pure Python on Gymnasium: no torch, no Ray. Each env takes the model's raw
answer text in ``step()`` and returns a text observation; ``instructions()``
gives the task description for the prompt. Importing this package registers
the ids in :data:`ENV_IDS` with Gymnasium::

    import gymnasium as gym
    import ragen_envs  # noqa: F401  (registers the ids)

    env = gym.make("ragen/SimpleSokoban-v0")
"""

from __future__ import annotations

import gymnasium as gym

from . import _old_paths
from .core.answer_env import AnswerEnv, AnswerResult
from .core.base import TextEnv
from .core.parsing import AnswerBlock, ParsedAnswer, ParserConfig, parse_answer, read_answer_block
from .games.versus import VersusEnv
from .grids.frozenlake import FrozenLakeEnv
from .grids.game2048 import Game2048Env
from .grids.sokoban import SokobanEnv
from .puzzles.bandit import Arm, BanditEnv
from .puzzles.countdown import CountdownEnv
from .puzzles.sudoku import SudokuEnv
from .qa.dataset_qa import DatasetQAEnv
from .qa.search_qa import SearchQAEnv

#: id -> (entry point, default kwargs). ``gym.make(id, **kwargs)`` overrides them.
_REGISTRY: dict[str, tuple[str, dict]] = {
    "ragen/Bandit-v0": ("ragen_envs.puzzles.bandit:BanditEnv", {"preset": "phoenix_dragon"}),
    "ragen/BanditTeacherEngineer-v0": (
        "ragen_envs.puzzles.bandit:BanditEnv",
        {"preset": "teacher_engineer"},
    ),
    "ragen/BanditHeldOut-v0": (
        "ragen_envs.puzzles.bandit:BanditEnv",
        {"preset": "librarian_trader"},
    ),
    "ragen/BanditRev-v0": (
        "ragen_envs.puzzles.bandit:BanditEnv",
        {"preset": "librarian_trader_rev"},
    ),
    "ragen/SimpleSokoban-v0": (
        "ragen_envs.grids.sokoban:SokobanEnv",
        {"dim_room": (6, 6), "num_boxes": 1},
    ),
    "ragen/LargeSokoban-v0": (
        "ragen_envs.grids.sokoban:SokobanEnv",
        {"dim_room": (8, 8), "num_boxes": 2},
    ),
    "ragen/SokobanNewVocab-v0": (
        "ragen_envs.grids.sokoban:SokobanEnv",
        {"dim_room": (6, 6), "num_boxes": 1, "vocab": "new"},
    ),
    "ragen/FrozenLake-v0": ("ragen_envs.grids.frozenlake:FrozenLakeEnv", {"is_slippery": True}),
    "ragen/FrozenLakeNoSlip-v0": (
        "ragen_envs.grids.frozenlake:FrozenLakeEnv",
        {"is_slippery": False},
    ),
    # Free-text answers (AnswerEnv): no action vocabulary.
    "ragen/Countdown-v0": ("ragen_envs.puzzles.countdown:CountdownEnv", {"attempts": 1}),
    "ragen/CountdownMultiTurn-v0": ("ragen_envs.puzzles.countdown:CountdownEnv", {"attempts": 4}),
    "ragen/Sudoku4x4-v0": ("ragen_envs.puzzles.sudoku:SudokuEnv", {"size": 4}),
    "ragen/Sudoku9x9-v0": ("ragen_envs.puzzles.sudoku:SudokuEnv", {"size": 9}),
    "ragen/2048-v0": ("ragen_envs.grids.game2048:Game2048Env", {}),
    # Question answering: a dataset of word problems, and search with a tool (BM25).
    "ragen/MathWordProblems-v0": ("ragen_envs.qa.dataset_qa:DatasetQAEnv", {}),
    "ragen/SearchQA-v0": ("ragen_envs.qa.search_qa:SearchQAEnv", {}),
    # Two-player games against a fixed opponent, the seat drawn per episode.
    **{
        f"ragen/{name}-v0": ("ragen_envs.games.versus:VersusEnv", {"game": game, "opponent": who})
        for name, game, who in (
            ("TicTacToe", "tictactoe", "random"),
            ("TicTacToeMinimax", "tictactoe", "minimax"),
            ("KuhnPoker", "kuhn_poker", "random"),
            ("KuhnPokerNash", "kuhn_poker", "nash"),
            ("SimpleNegotiation", "simple_negotiation", "random"),
            ("SimpleNegotiationTrader", "simple_negotiation", "trader"),
        )
    },
}
ENV_IDS: tuple[str, ...] = tuple(_REGISTRY)
#: The ids the built-in model was pretrained on (today every registered one): its
#: vocabulary and warm-start transcripts are built from these envs only, so an env
#: added to the registry leaves the shipped model (and its build key) unchanged
#: until it is added here and the model rebuilt.
BUILTIN_MODEL_ENV_IDS: tuple[str, ...] = (
    "ragen/Bandit-v0",
    "ragen/BanditTeacherEngineer-v0",
    "ragen/BanditHeldOut-v0",
    "ragen/BanditRev-v0",
    "ragen/SimpleSokoban-v0",
    "ragen/LargeSokoban-v0",
    "ragen/SokobanNewVocab-v0",
    "ragen/FrozenLake-v0",
    "ragen/FrozenLakeNoSlip-v0",
    "ragen/Countdown-v0",
    "ragen/CountdownMultiTurn-v0",
    "ragen/Sudoku4x4-v0",
    "ragen/Sudoku9x9-v0",
    "ragen/2048-v0",
    "ragen/MathWordProblems-v0",
    "ragen/SearchQA-v0",
)
#: The two-player games' ids (not in the built-in model's pretraining yet).
GAME_ENV_IDS: tuple[str, ...] = tuple(i for i in ENV_IDS if i not in BUILTIN_MODEL_ENV_IDS)

_old_paths.install()  # `ragen_envs.sokoban` and the other flat paths of earlier releases
for _env_id, (_entry_point, _kwargs) in _REGISTRY.items():
    if _env_id not in gym.registry:
        gym.register(id=_env_id, entry_point=_entry_point, kwargs=_kwargs)

__all__ = [
    "BUILTIN_MODEL_ENV_IDS",
    "ENV_IDS",
    "GAME_ENV_IDS",
    "AnswerBlock",
    "AnswerEnv",
    "AnswerResult",
    "Arm",
    "BanditEnv",
    "CountdownEnv",
    "DatasetQAEnv",
    "FrozenLakeEnv",
    "Game2048Env",
    "ParsedAnswer",
    "ParserConfig",
    "SearchQAEnv",
    "SokobanEnv",
    "SudokuEnv",
    "TextEnv",
    "VersusEnv",
    "parse_answer",
    "read_answer_block",
]
