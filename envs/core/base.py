"""The turn protocol shared by every text environment.

One ``step()`` is one model turn: the raw answer text goes in, is parsed
(:mod:`.parsing`), its valid actions are executed one by one against the
per-turn and per-trajectory action budgets, and the turn's reward is the sum of
the executed actions' rewards plus, once, the format penalty when the answer
was unparsable or named an invalid action.

Subclasses only say how an episode starts, what one action does, and how the
state is drawn as text; they never see the answer text.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
import numpy as np

from .parsing import ParsedAnswer, ParserConfig, parse_answer

# Characters an answer may be sampled from by ``action_space.sample()``; the env
# itself accepts any ``str``.
_ANSWER_CHARSET = string.ascii_letters + string.digits + " <>/|_-.,:\n"
#: The values of the ``instructions`` constructor argument.
INSTRUCTION_STYLES = ("full", "compact")


def grid_coordinates(grid: str, symbols: str) -> str:
    """Where ``symbols`` stand in the text ``grid`` (one row per line): one
    ``"<symbol> <row>,<column> ..."`` entry per symbol present, 0-based and row-major,
    the entries in the order of ``symbols``, joined by ``"; "``.

    >>> grid_coordinates("P_O\\n__G", "PGO")
    'P 0,0; G 1,2; O 0,2'
    """
    rows = grid.split("\n")
    entries = []
    for symbol in symbols:
        cells = [
            f"{r},{c}" for r, row in enumerate(rows) for c, cell in enumerate(row) if cell == symbol
        ]
        if cells:
            entries.append(f"{symbol} {' '.join(cells)}")
    return "; ".join(entries)


def grid_neighbours(
    grid: str, player_symbols: str, moves: dict[str, tuple[int, int]], outside: str = "#"
) -> str:
    """What lies one step from the player in the text ``grid`` (one row per line), for
    each move: ``"<move> <symbol>"`` entries in the order of ``moves``, joined by
    ``"; "``; a step off the grid reads ``outside``. The player is the first cell
    holding one of ``player_symbols``; with none, the line is empty.

    >>> grid_neighbours("P_O\\n__G", "P", {"Up": (-1, 0), "Down": (1, 0), "Right": (0, 1)})
    'Up #; Down _; Right _'
    """
    rows = grid.split("\n")
    where = next(
        (
            (r, c)
            for r, row in enumerate(rows)
            for c, cell in enumerate(row)
            if cell in player_symbols
        ),
        None,
    )
    if where is None:
        return ""
    entries = []
    for move, (dr, dc) in moves.items():
        r, c = where[0] + dr, where[1] + dc
        inside = 0 <= r < len(rows) and 0 <= c < len(rows[r])
        entries.append(f"{move} {rows[r][c] if inside else outside}")
    return "; ".join(entries)


def place_words(origin: tuple[int, int], cell: tuple[int, int]) -> str:
    """Where ``cell`` lies seen from ``origin`` on a grid, in words (rows grow down).

    >>> place_words((1, 0), (2, 3))
    '1 down and 3 right'
    >>> place_words((2, 2), (0, 2))
    '2 up'
    """
    dr, dc = cell[0] - origin[0], cell[1] - origin[1]
    parts = []
    if dr:
        parts.append(f"{abs(dr)} {'down' if dr > 0 else 'up'}")
    if dc:
        parts.append(f"{abs(dc)} {'right' if dc > 0 else 'left'}")
    return " and ".join(parts) or "here"


def check_distance_shaping(value: Any) -> float:
    """A reward-shaping coefficient as a float: a finite number >= 0 (0: off)."""
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not 0 <= value < float("inf")
    ):
        raise ValueError(f"distance_shaping must be a finite number >= 0, got {value!r}")
    return float(value)


def coordinates_max_length(grid_length: int, symbols: str) -> int:
    """An upper bound on the length of :func:`grid_coordinates` for a grid of at most
    ``grid_length`` characters (each cell listed once, at most two 2-digit numbers)."""
    return grid_length * 6 + len(symbols) * 4


class TextEnv(gym.Env):
    """Base class for the turn-based text environments.

    Args:
        action_budget: actions a whole trajectory may execute; when it is spent
            the episode is truncated.
        max_actions_per_turn: actions executed per turn at most.
        format_penalty: reward added once per turn whose answer broke the
            format or named an invalid action (paper: -0.1).
        require_think: whether ``<think>...</think>`` must precede ``<answer>``.
        separator: the string between actions inside ``<answer>``.
        think_tags, answer_tags: the (opening, closing) strings the answer uses in
            place of ``<think>``/``</think>`` and ``<answer>``/``</answer>``
            (:class:`~.parsing.ParserConfig`); the prompt's format reminder and
            prefill should then say the same (the run's ``prompt`` setting).
        max_turns: turns after which the episode is truncated (None: no limit;
            the trainer's own turn limit still applies).
        max_answer_chars: the ``action_space`` length bound (sampling only).
        instructions: the style of :meth:`instructions`: ``"full"`` (the task, the
            symbol legend, the actions and the budgets, for real LLMs) or
            ``"compact"`` (the goal, the symbols that matter and the action names,
            in a few words: a much shorter prompt for small models).
        coordinates: grid envs only: append to every observation a line that says
            where the landmark symbols stand (:func:`grid_coordinates`), e.g.
            ``"P 1,0; G 2,3; O 0,2 1,3"`` (0-based row,column). The grid stays; the
            line spares a small model the counting along rows and columns.
        neighbours: grid envs only: append to every observation a line that says
            what lies one move away in each direction (:func:`grid_neighbours`),
            e.g. ``"Up #; Down O; Left _; Right G"`` (a step off the grid reads
            :attr:`outside_symbol`: ``#``, or Sokoban's wall symbol of its vocab).
            The grid stays; the line spares a small model finding the player's
            neighbours, which is what a step into a hole comes from.
    """

    metadata = {"render_modes": ["ansi"]}
    #: Every character a rendered observation may contain (set by subclasses).
    obs_charset: str = ""
    #: Upper bound on the observation length (set by subclasses).
    obs_max_length: int = 1024
    #: Grid envs: the symbols the ``coordinates`` line lists, in its order.
    landmark_symbols: str = ""
    #: Grid envs: the symbols that mark the player (the ``neighbours`` line's origin).
    player_symbols: str = ""
    #: Grid envs: each move's (row, column) step, in the ``neighbours`` line's order.
    move_offsets: dict[str, tuple[int, int]] = {}
    #: Grid envs: what the ``neighbours`` line writes for a step off the grid.
    outside_symbol: str = "#"
    #: True where observations carry open-ended text from data (questions, passages)
    #: rather than the env's own fixed wording; a vocabulary built from the env's
    #: texts should take only its instructions, not every such word (the built-in
    #: model's vocabulary leaves such an env's observations out altogether).
    open_vocabulary: bool = False

    def __init__(
        self,
        *,
        action_budget: int,
        max_actions_per_turn: int = 5,
        format_penalty: float = -0.1,
        require_think: bool = True,
        separator: str = "||",
        think_tags: tuple[str, str] | list[str] = ("<think>", "</think>"),
        answer_tags: tuple[str, str] | list[str] = ("<answer>", "</answer>"),
        max_turns: int | None = None,
        max_answer_chars: int = 512,
        render_mode: str | None = None,
        instructions: str = "full",
        coordinates: bool = False,
        neighbours: bool = False,
    ) -> None:
        if not isinstance(action_budget, int) or action_budget < 1:
            raise ValueError(f"action_budget must be an int >= 1, got {action_budget!r}")
        if max_turns is not None and (not isinstance(max_turns, int) or max_turns < 1):
            raise ValueError(f"max_turns must be None or an int >= 1, got {max_turns!r}")
        if render_mode not in (None, "ansi"):
            raise ValueError(f"render_mode must be None or 'ansi', got {render_mode!r}")
        if instructions not in INSTRUCTION_STYLES:
            raise ValueError(
                f"instructions must be one of {list(INSTRUCTION_STYLES)}, got {instructions!r}"
            )
        if not isinstance(coordinates, bool):
            raise ValueError(f"coordinates must be true or false, got {coordinates!r}")
        if coordinates and not self.landmark_symbols:
            raise ValueError(
                f"coordinates=True needs a grid env; {type(self).__name__} draws no grid"
            )
        if not isinstance(neighbours, bool):
            raise ValueError(f"neighbours must be true or false, got {neighbours!r}")
        if neighbours and not self.move_offsets:
            raise ValueError(
                f"neighbours=True needs a grid env; {type(self).__name__} draws no grid"
            )
        self.instructions_style = instructions
        self.coordinates = coordinates
        self.neighbours = neighbours
        charset, max_length = self.obs_charset, self.obs_max_length
        grid_length = max_length
        if coordinates:
            charset = "".join(sorted(set(charset) | set(string.digits + ",; ")))
            max_length += 1 + coordinates_max_length(grid_length, self.landmark_symbols)
        if neighbours:
            letters = "".join(self.move_offsets) + self.outside_symbol + "; "
            charset = "".join(sorted(set(charset) | set(letters)))
            max_length += 1 + sum(len(move) + 4 for move in self.move_offsets)
        self.action_budget = action_budget
        self.max_turns = max_turns
        self.format_penalty = float(format_penalty)
        self.parser = ParserConfig(
            require_think=require_think,
            separator=separator,
            max_actions=max_actions_per_turn,
            think_tags=tuple(think_tags),
            answer_tags=tuple(answer_tags),
        )
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Text(
            max_length=max_length, min_length=1, charset=charset
        )
        self.action_space = gym.spaces.Text(max_length=max_answer_chars, charset=_ANSWER_CHARSET)
        self._actions_left = 0
        self._turn = 0
        self._done = True

    # ----- hooks for subclasses -------------------------------------------------
    @property
    def action_names(self) -> tuple[str, ...]:
        """Canonical spelling of the actions this episode accepts."""
        raise NotImplementedError

    def _new_episode(self) -> None:
        """Draw a new initial state from ``self.np_random``."""
        raise NotImplementedError

    def _execute(self, action: str) -> tuple[float, bool, bool]:
        """Apply one valid action; return (reward, state changed, episode terminated)."""
        raise NotImplementedError

    def _render_text(self) -> str:
        """The current state as text (the observation)."""
        raise NotImplementedError

    def _is_success(self) -> bool:
        raise NotImplementedError

    def _extra_info(self) -> dict[str, Any]:
        """Env-specific entries for this turn's ``info``."""
        return {}

    def state_notes(self) -> str | None:
        """A few true sentences about the current state, for a reasoning text that reads
        the state without deciding anything (where the goal lies, what is next to the
        player), or None for an env that has none (a format warm-up then writes filler
        words; ``format_warmup_think``)."""
        return None

    def well_formed(self, answer: str) -> bool:
        """Whether ``answer`` (the model's raw text) is written in this env's answer
        language, whatever the state: the tags, and actions that are all names of
        the vocabulary. A free-text env checks the syntax of its answers (an
        expression, placements, a command) but not whether the state allows them:
        an expression over numbers that are not given, or a placement on a given
        cell, is well formed and refused, like a move into a wall."""
        return parse_answer(answer, self.action_names, self.parser).is_valid

    def random_actions(self, rng: np.random.Generator) -> list[str]:
        """One turn of a random agent: 1 to ``max_actions_per_turn`` actions drawn
        uniformly from the valid ones, whatever the state. Free-text envs return a
        random well-formed answer of their kind instead (the random baseline of the
        demo, and the answers of the built-in model's pretraining transcripts)."""
        n = int(rng.integers(1, self.parser.max_actions + 1))
        return [str(a) for a in rng.choice(self.action_names, size=n)]

    def instructions(self) -> str:
        """The task description that opens the prompt, in the configured style."""
        if self.instructions_style == "compact":
            return self._compact_instructions()
        return self._full_instructions()

    def _full_instructions(self) -> str:
        """Task, symbol legend, available actions and action budget."""
        raise NotImplementedError

    def _compact_instructions(self) -> str:
        """The goal, the symbols that matter and the action names, in a few words."""
        raise NotImplementedError

    # ----- gymnasium API --------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._new_episode()
        self._actions_left = self.action_budget
        self._turn = 0
        self._done = False
        return self._observe(), {"actions_left": self._actions_left, "success": False}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one turn: ``action`` is the model's raw answer text."""
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"step() takes the model's answer as str, got {type(action).__name__}")
        parsed = parse_answer(action, self.action_names, self.parser)
        to_run = parsed.actions[: self._actions_left]
        env_reward, n_run, n_effective, terminated = 0.0, 0, 0, False
        executed: list[str] = []
        for name in to_run:
            reward, changed, terminated = self._execute(name)
            env_reward += reward
            n_run += 1
            n_effective += int(changed)
            executed.append(name)
            self._actions_left -= 1
            if terminated:
                break
        penalty = 0.0 if parsed.is_valid else self.format_penalty
        self._turn += 1
        out_of_turns = self.max_turns is not None and self._turn >= self.max_turns
        truncated = not terminated and (self._actions_left <= 0 or out_of_turns)
        self._done = terminated or truncated
        info = self._turn_info(parsed, executed, n_effective, env_reward, penalty)
        return self._observe(), env_reward + penalty, terminated, truncated, info

    def render(self) -> str | None:
        return self._observe() if self.render_mode == "ansi" else None

    def _observe(self) -> str:
        """The observation: the drawn state, plus the coordinates and neighbours
        lines when asked for."""
        grid = text = self._render_text()
        if self.coordinates:
            text += "\n" + grid_coordinates(grid, self.landmark_symbols)
        if self.neighbours:
            text += "\n" + grid_neighbours(
                grid, self.player_symbols, self.move_offsets, self.outside_symbol
            )
        return text

    def _turn_info(
        self,
        parsed: ParsedAnswer,
        executed: list[str],
        n_effective: int,
        env_reward: float,
        penalty: float,
    ) -> dict[str, Any]:
        return {
            "success": self._is_success(),
            "format_ok": parsed.format_ok,
            "format_error": parsed.error,
            "action_is_valid": parsed.is_valid,
            "action_is_effective": bool(executed) and n_effective == len(executed),
            "num_actions": len(executed),
            "num_effective_actions": n_effective,
            "num_invalid_actions": len(parsed.invalid),
            "executed_actions": tuple(executed),
            "actions_left": self._actions_left,
            "env_reward": env_reward,
            "format_penalty": penalty,
            "turn": self._turn,
            **self._extra_info(),
        }
