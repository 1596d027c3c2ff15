"""Self-play through the env runner: a group's rollouts pair up as the two seats of one
game, each seat's turns its own trajectory, both seats answered in the same engine
batches; the outcome is zero-sum; each seat's prompt shows the other's move."""

from __future__ import annotations

import pytest
from conftest import private_env, tiny_config, tiny_dict, train_iterations
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from ragen_rllib.connectors.sample_batch import build_sample_pipeline
from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner


@pytest.fixture(scope="module")
def played():
    cfg = tiny_config(
        env="ragen/TicTacToe-v0", self_play=True, group_size=4, max_turns=8,
        max_new_tokens=12, llm="builtin", minibatch_size=4,
    )  # fmt: skip
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    calls = []
    generate = runner.engine.generate

    def counted(prompts, *args, **kwargs):
        calls.append(len(prompts))
        return generate(prompts, *args, **kwargs)

    runner.engine.generate = counted
    seeds, groups = [5] * 4 + [6] * 4 + [7] * 4, [0] * 4 + [1] * 4 + [2] * 4
    trajs = runner.run_episodes(seeds, groups, SamplingParams(1.0, 1.0, 12), sample_seed=0)
    yield runner, trajs, calls
    runner.stop()


def test_the_rollouts_of_a_group_are_the_two_seats_of_its_games(played):
    _, trajs, _ = played
    for i, traj in enumerate(trajs):
        assert traj.turn_infos and traj.turn_infos[-1]["seat"] == i % 2
        assert ("You play X." if i % 2 == 0 else "You play O.") in traj.turn_prompts[0]
    for first, second in zip(trajs[::2], trajs[1::2], strict=True):
        # Seats alternate: seat 0 moves first, so it has as many turns or one more.
        assert len(first.turn_rewards) - len(second.turn_rewards) in (0, 1)
        assert {first.end_reason, second.end_reason} <= {"terminated", "truncated", "max_turns"}
        if first.end_reason == "terminated" or second.end_reason == "terminated":
            a, b = first.turn_infos[-1], second.turn_infos[-1]
            assert a["payoff"] == -b["payoff"]  # zero-sum
            outcomes = {a["outcome"], b["outcome"]}
            assert outcomes in ({"win", "loss"}, {"draw"})
            assert first.success == (a["outcome"] == "win")


def test_a_seats_next_prompt_shows_the_other_seats_move(played):
    _, trajs, _ = played
    for second in trajs[1::2]:
        # O's every prompt comes after X moved (or lost its turn).
        for prompt in second.turn_prompts:
            assert "Your opponent (X)" in prompt, prompt
    for first in trajs[::2]:
        for prompt in first.turn_prompts[1:]:
            assert "Your opponent (O)" in prompt, prompt


def test_both_seats_are_answered_in_the_same_engine_batches(played):
    _, trajs, calls = played
    turns = sum(len(t.turn_rewards) for t in trajs)
    assert sum(calls) == turns
    # Seats alternate, but 6 games' seats share every call: far fewer calls than turns.
    assert len(calls) <= max(len(t.turn_rewards) for t in trajs) * 2 + 1
    assert max(calls) >= 6


def test_game_metrics_of_a_self_play_batch_are_zero_sum(played):
    """Both seats of every game are in the batch: as many wins as losses, and the
    payoffs (unfinished games 0) average exactly 0."""
    from ragen_rllib.env_runner.metrics import rollout_metrics

    _, trajs, _ = played
    out = rollout_metrics(trajs)
    assert out["game/win_rate"] == out["game/loss_rate"]
    assert out["game/win_rate"] + out["game/draw_rate"] + out["game/loss_rate"] <= 1
    assert out["game/payoff_mean"] == 0.0
    seat0 = out["game/payoff_mean_seat0"]
    assert out["game/payoff_mean_seat1"] == pytest.approx(-seat0)


def test_evaluating_the_training_env_plays_both_seats_of_each_state(played):
    """A self-play run's evaluation of its own env: every state is a game of two
    seats (one sample a state gives two trajectories, paired)."""
    runner, _, _ = played
    metrics, trajs = runner.evaluate(num_states=3, first_seed=100, temperature=1.0)
    assert len(trajs) == 6 and metrics["num_trajectories"] == 6
    assert [t.turn_infos[-1]["seat"] for t in trajs] == [0, 1] * 3
    assert metrics["game/win_rate"] == metrics["game/loss_rate"]


def test_evaluation_plays_the_fixed_opponents(played):
    """A self-play run's evaluation suite (tictactoe: random, greedy, minimax) plays
    the one-agent envs: the model's seat drawn per seed, the opponent inside the env."""
    from ragen_rllib.env_choice.eval_suites import resolve_suites

    runner, _, _ = played
    [random, greedy, minimax] = resolve_suites(runner.config, ["tictactoe"])["tictactoe"]
    assert (random.name, greedy.name, minimax.name) == ("random", "greedy", "minimax")
    params = SamplingParams(1.0, 1.0, 12)
    trajs = runner.run_episodes(list(range(8)), list(range(8)), params, 0, env=minimax)
    seats = {t.turn_infos[0]["seat"] for t in trajs if t.turn_infos}
    assert seats == {0, 1}
    assert not any(t.success for t in trajs)  # minimax never loses
    trajs = runner.run_episodes(list(range(8)), list(range(8)), params, 0, env=greedy)
    assert len(trajs) == 8 and all(t.end_reason != "env_error" for t in trajs)


def test_the_runner_hands_freed_memory_back_after_each_batch(played, monkeypatch):
    """After a training batch and after an evaluation the runner trims the C heap
    (distributed/host_memory.py): what the batch freed does not pile up."""
    from ragen_rllib.env_runner import llm_env_runner

    runner, _, _ = played
    trims = []
    monkeypatch.setattr(llm_env_runner, "trim_host_heap", lambda: trims.append(1) or True)
    runner.sample_groups([3], [0], sample_seed=0)
    assert len(trims) == 1
    runner.evaluate(num_states=2, first_seed=0, temperature=1.0)
    assert len(trims) == 2


def test_the_config_refuses_what_self_play_cannot_do():
    base = dict(
        env="ragen/TicTacToe-v0", self_play=True, group_size=4, minibatch_size=4, max_turns=6
    )
    tiny_config(**base).validate()
    for bad, says in [
        ({"max_turns": 5}, r"a seat makes up to 5 moves .* use max_turns >= 6"),
        (
            {"reward_norm_grouping": "state_seat", "group_size": 2, "minibatch_size": 2},
            r"some seat of a group has 1 trained rollout",
        ),
        ({"group_size": 3, "minibatch_size": 2}, "use an even group_size"),
        ({"env": "ragen/Bandit-v0"}, "is no two-player game"),
        ({"env_config": {"invalid_move": "lose_game"}}, "invalid_move=lose_game"),
    ]:
        with pytest.raises(ValueError, match=says):
            tiny_config(**{**base, **bad}).validate()


# ----- a PettingZoo env written here, importing nothing of the project -----------------
NIM_DUEL = r"""
# Nim for two: a pile of stones, each turn take 1 or 2; who takes the last stone wins.
# A PettingZoo AEC env with text observations and the model's answer text as actions.

import re
import string

import gymnasium
from pettingzoo import AECEnv
from pettingzoo.utils.agent_selector import AgentSelector

TAKE = re.compile(r"<answer>\s*([12])\s*</answer>")


class NimDuel(AECEnv):
    metadata = {"name": "nim_duel_v0", "render_modes": [], "is_parallelizable": False}

    def __init__(self, smallest=4, largest=7, loser_payoff=-1.0):
        super().__init__()
        self.smallest, self.largest = smallest, largest
        self.loser_payoff = float(loser_payoff)
        self.possible_agents = ["first", "second"]
        text = gymnasium.spaces.Text(max_length=4096, charset=string.printable)
        self._spaces = {a: text for a in self.possible_agents}

    def observation_space(self, agent):
        return self._spaces[agent]

    def action_space(self, agent):
        return self._spaces[agent]

    def instructions(self, agent):
        return (f"You play Nim as the {agent} player. Players take turns taking 1 or 2 "
                "stones from the pile; whoever takes the last stone wins. Answer "
                "<think> ... </think> <answer>1</answer> or <answer>2</answer>.")

    def reset(self, seed=None, options=None):
        self.np_random, _ = gymnasium.utils.seeding.np_random(seed)
        self.pile = int(self.np_random.integers(self.smallest, self.largest + 1))
        self.agents = list(self.possible_agents)
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self._selector = AgentSelector(self.agents)
        self.agent_selection = self._selector.next()

    def observe(self, agent):
        return f"There are {self.pile} stones in the pile."

    def step(self, action):
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self._was_dead_step(action)
            return
        self._cumulative_rewards[agent] = 0.0
        self.rewards = {a: 0.0 for a in self.agents}
        found = TAKE.search(action or "")
        if found is None:  # no move named: take one, and a penalty
            self.rewards[agent] -= 0.1
        self.pile -= min(int(found.group(1)) if found else 1, self.pile)
        if self.pile == 0:
            other = [a for a in self.agents if a != agent][0]
            self.rewards[agent] += 1.0
            self.rewards[other] += self.loser_payoff
            self.terminations = {a: True for a in self.agents}
            self.infos = {agent: {"success": True}, other: {"success": False}}
        self._accumulate_rewards()
        self.agent_selection = self._selector.next()


def env(**kwargs):
    return NimDuel(**kwargs)
"""


@pytest.fixture()
def nim_module(tmp_path, monkeypatch):
    (tmp_path / "nim_duel.py").write_text(NIM_DUEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_a_pettingzoo_env_plays_both_seats(nim_module):
    """env: nim_duel:env (PettingZoo's factory convention), self_play left out: its two
    agents are a group's paired rollouts; rewards are the AEC env's, zero-sum at the
    end; its instructions open each seat's first prompt."""
    assert "ragen" not in NIM_DUEL
    cfg = tiny_config(
        env="nim_duel:env", group_size=4, max_turns=8, max_new_tokens=12, llm="builtin",
        minibatch_size=4,
    )  # fmt: skip
    cfg.validate()
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    params = SamplingParams(1.0, 1.0, 12)
    trajs = runner.run_episodes([3] * 4 + [4] * 4, [0] * 4 + [1] * 4, params, sample_seed=0)
    runner.stop()
    for first, second in zip(trajs[::2], trajs[1::2], strict=True):
        assert first.end_reason == second.end_reason == "terminated"
        assert "Nim as the first player" in first.turn_prompts[0]
        assert "Nim as the second player" in second.turn_prompts[0]
        assert len(first.turn_rewards) - len(second.turn_rewards) in (0, 1)
        # The last mover won (+1), the other lost (-1); penalties of -0.1 per bad answer.
        won = first if len(first.turn_rewards) > len(second.turn_rewards) else second
        lost = second if won is first else first
        assert won.success and not lost.success
        assert round(won.turn_rewards[-1], 6) in (1.0, 0.9)
        assert round(lost.turn_rewards[-1], 6) in (-1.0, -1.1)


def test_a_game_over_before_the_second_seats_move_drops_its_group(nim_module):
    """A pile of one stone: the first seat takes it and wins at once, the second seat
    has nothing to train; its trajectory is an env error (its group is dropped)."""
    cfg = tiny_config(
        env="nim_duel:env", env_config={"smallest": 1, "largest": 1}, self_play=True,
        group_size=2, max_turns=4, max_new_tokens=8, llm="builtin", minibatch_size=2,
    )  # fmt: skip
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    first, second = runner.run_episodes([0, 0], [0, 0], SamplingParams(1.0, 1.0, 8), 0)
    runner.stop()
    assert first.end_reason == "terminated" and round(first.turn_rewards[-1], 6) in (1.0, 0.9)
    assert second.end_reason == "env_error" and not second.turn_rewards
    assert "ended before its first move" in second.error


def test_a_non_finite_payoff_is_the_games_env_error(nim_module):
    """The seat whose game ended on the other's move gets its payoff at the settling;
    a NaN there ends that trajectory as an env error (its group is dropped), as a
    non-finite reward from step() does."""
    cfg = tiny_config(
        env="nim_duel:env", env_config={"loser_payoff": "nan"}, group_size=2, max_turns=8,
        max_new_tokens=8, llm="builtin", minibatch_size=2,
    )  # fmt: skip
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    trajs = runner.run_episodes([0, 0, 1, 1], [0, 0, 1, 1], SamplingParams(1.0, 1.0, 8), 0)
    runner.stop()
    for pair in (trajs[:2], trajs[2:]):
        ends = sorted(t.end_reason for t in pair)
        assert ends == ["env_error", "terminated"], [t.error for t in pair]
        lost = next(t for t in pair if t.end_reason == "env_error")
        assert lost.error == (
            "settle(): ValueError: the env returned a reward of nan: it must be a finite number"
        )
    metrics = MetricsLogger()
    build_sample_pipeline(cfg)(rl_module=None, batch={}, episodes=trajs, metrics=metrics)
    assert trajs == [] and metrics.peek(("rollout", "env_error_groups_dropped")) == 2


def test_pooled_envs_start_each_call_afresh(nim_module):
    """The runner keeps its envs between calls: a second call's one-stone games still
    drop their second seat before it moves (no answer spent on a finished game),
    whatever the same env objects played before; both seats carry their seat."""
    cfg = tiny_config(
        env="nim_duel:env", env_config={"smallest": 1, "largest": 2}, self_play=True,
        group_size=2, max_turns=4, max_new_tokens=8, llm="builtin", minibatch_size=2,
    )  # fmt: skip
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    params = SamplingParams(1.0, 1.0, 8)
    dropped = 0
    for call in range(3):
        seeds = [10 * call + g for g in range(4) for _ in range(2)]
        groups = [g for g in range(4) for _ in range(2)]
        trajs = runner.run_episodes(seeds, groups, params, sample_seed=call)
        for i, traj in enumerate(trajs):
            if traj.end_reason == "env_error":
                assert i % 2 == 1 and not traj.turn_rewards, traj.error
                assert "ended before its first move" in traj.error
                dropped += call > 0
            else:
                assert traj.turn_infos[-1]["seat"] == i % 2
    runner.stop()
    assert dropped >= 1


def test_a_pettingzoo_factory_turns_self_play_on_and_the_header_says_why(nim_module, tmp_path):
    """self_play null (the default) is on when env names a PettingZoo AEC env's factory,
    off for any other env (a built-in game plays its fixed opponent); the header says
    it is on and why."""
    from ragen_rllib.cli.train import header
    from ragen_rllib.env_choice.env_mix import mix_entries

    game = dict(group_size=4, minibatch_size=4, max_turns=8)
    cfg = tiny_config(env="nim_duel:env", **game)
    assert cfg.self_play is None and cfg.self_play_used
    cfg.validate()
    assert mix_entries(cfg)[0].env_config == {"opponent": "self"}
    text = header("nim", cfg, {}, str(tmp_path))
    assert "  self-play  on (env nim_duel:env is a two-player PettingZoo AEC env)" in text
    named = tiny_config(env="nim_duel:env", self_play=True, **game)
    assert "  self-play  on (self_play: true)" in header("nim", named, {}, str(tmp_path))
    for env in ("ragen/TicTacToe-v0", "ragen/Bandit-v0"):
        off = tiny_config(env=env, **game)
        assert not off.self_play_used and off.self_play_note() is None
        assert "self-play" not in header("off", off, {}, str(tmp_path))


def test_self_play_false_or_a_function_that_is_no_game_is_refused(nim_module):
    with pytest.raises(
        ValueError,
        match=r"config self_play=False is invalid with env='nim_duel:env': .* plays only in "
        r"self-play .*allowed: null \(the default: self-play, chosen from the env\) or true",
    ):
        tiny_config(env="nim_duel:env", self_play=False).check_values()
    (nim_module / "no_game.py").write_text("def env(**kwargs):\n    return 'a string'\n")
    with pytest.raises(
        ValueError, match=r"config env='no_game:env' is invalid: .* no two-player AEC env"
    ):
        tiny_config(env="no_game:env", group_size=4, minibatch_size=4).check_values()
    with pytest.raises(ValueError, match=r"config self_play=1 is invalid: must be null"):
        tiny_config(env="ragen/TicTacToe-v0", self_play=1).check_values()


@pytest.mark.slow
def test_a_pettingzoo_env_trains_two_iterations(nim_module, tmp_path):
    base = tiny_dict(  # self_play left out: on for a PettingZoo factory
        env="nim_duel:env", group_size=4, env_groups=2, max_turns=8, max_new_tokens=12,
        minibatch_size=4,
    )  # fmt: skip
    fields = """{"trained": learner["num_module_steps_trained"], "loss": learner["total_loss"],
              "turns": r["rollout"]["num_turns_mean"], "errors": r["rollout"]["env_errors"]}"""
    out = train_iterations(
        tmp_path, base, fields, env=private_env(tmp_path, PYTHONPATH=str(nim_module))
    )
    for row in out["rows"]:
        assert row["trained"] == 8 and row["errors"] == 0 and row["loss"] == row["loss"], row
        assert row["turns"] >= 2  # a game of at least 4 stones: two turns a seat at least


def test_negotiation_self_play_pays_both_seats_through_the_runner():
    """Simple Negotiation in self-play through the runner (ten game turns, lost turns
    included): every game ends with both seats paid, zero-sum."""
    cfg = tiny_config(
        env="ragen/SimpleNegotiation-v0", self_play=True, group_size=4, max_turns=8,
        max_new_tokens=12, llm="builtin", minibatch_size=4,
    )  # fmt: skip
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    try:
        trajs = runner.run_episodes([1] * 4, [0] * 4, SamplingParams(1.0, 1.0, 12), 0)
    finally:
        runner.stop()
    assert [t.end_reason for t in trajs] == ["terminated"] * 4
    for first, second in zip(trajs[::2], trajs[1::2], strict=True):
        payoffs = first.turn_infos[-1]["payoff"], second.turn_infos[-1]["payoff"]
        assert payoffs[0] + payoffs[1] == 0 and None not in payoffs
