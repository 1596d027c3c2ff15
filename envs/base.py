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

from .parsing import ParsedAnswer, ParserConfig, parse_answer

# Characters an answer may be sampled from by ``action_space.sample()``; the env
# itself accepts any ``str``.
_ANSWER_CHARSET = string.ascii_letters + string.digits + " <>/|_-.,:\n"
#: The values of the ``instructions`` constructor argument.
INSTRUCTION_STYLES = ("full", "compact")


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
        max_turns: turns after which the episode is truncated (None: no limit;
            the trainer's own turn limit still applies).
        max_answer_chars: the ``action_space`` length bound (sampling only).
        instructions: the style of :meth:`instructions`: ``"full"`` (the task, the
            symbol legend, the actions and the budgets, for real LLMs) or
            ``"compact"`` (the goal, the symbols that matter and the action names,
            in a few words: a much shorter prompt for small models).
    """

    metadata = {"render_modes": ["ansi"]}
    #: Every character a rendered observation may contain (set by subclasses).
    obs_charset: str = ""
    #: Upper bound on the observation length (set by subclasses).
    obs_max_length: int = 1024

    def __init__(
        self,
        *,
        action_budget: int,
        max_actions_per_turn: int = 5,
        format_penalty: float = -0.1,
        require_think: bool = True,
        separator: str = "||",
        max_turns: int | None = None,
        max_answer_chars: int = 512,
        render_mode: str | None = None,
        instructions: str = "full",
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
        self.instructions_style = instructions
        self.action_budget = action_budget
        self.max_turns = max_turns
        self.format_penalty = float(format_penalty)
        self.parser = ParserConfig(
            require_think=require_think, separator=separator, max_actions=max_actions_per_turn
        )
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Text(
            max_length=self.obs_max_length, min_length=1, charset=self.obs_charset
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
        return self._render_text(), {"actions_left": self._actions_left, "success": False}

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
        return self._render_text(), env_reward + penalty, terminated, truncated, info

    def render(self) -> str | None:
        return self._render_text() if self.render_mode == "ansi" else None

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
