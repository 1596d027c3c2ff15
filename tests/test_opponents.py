"""Self-play against opponent policies (RLlib's multi-agent settings): the config reads
them and leaves RLlib one policy; the runner seats each game's two rollouts by the
mapping, generates the opponents' turns on their own engine with a snapshot of the
trained weights, and returns only the trained policy's trajectories."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_config, tiny_dict, train_iterations

from ragen_rllib.engines.base import SamplingParams
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.env_runner.self_play.seats import AGENT_IDS, GameRef
from ragen_rllib.env_runner.self_play.snapshots import INITIAL

GAME = dict(
    env="ragen/TicTacToe-v0", self_play=True, group_size=4, max_turns=8, max_new_tokens=12,
    llm="builtin", minibatch_size=4,
)  # fmt: skip
VERSUS_PAST = dict(policies=["main", "past"], policies_to_train=["main"])


def seat_one_past(agent_id, episode, **kwargs):
    """The trained policy always sits at seat 0 (a mapping named as module:function)."""
    return "main" if agent_id == "player_0" else "past"


def test_the_config_reads_the_policies_and_leaves_rllib_one():
    cfg = tiny_config(**GAME, **VERSUS_PAST, policy_mapping_fn="alternate")
    cfg.validate()
    setup = cfg.opponent_setup
    assert (setup.trained, setup.opponents) == ("main", ("past",))
    assert not cfg.is_multi_agent and set(cfg.policies) == {"default_policy"}
    assert [setup.seat(GameRef(k, 0)) for k in range(3)] == [
        ("main", "past"), ("past", "main"), ("main", "past"),
    ]  # fmt: skip
    again = cfg.copy(copy_frozen=False)
    again.validate()  # a copy (Tune's) validates again and keeps the setup
    assert again.opponent_setup == setup
    fluent = tiny_config(**GAME)
    fluent.multi_agent(
        policies={"me", "frozen"},
        policy_mapping_fn=lambda agent_id, episode, **kw: (
            "me" if agent_id == AGENT_IDS[0] else "frozen"
        ),
        policies_to_train=["me"],
    )
    fluent.validate()
    assert fluent.opponent_setup.seat(GameRef(3, 0)) == ("me", "frozen")


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"policies": ["main", "past"]}, r"policies_to_train=None is invalid: must name exactly"),
        ({**VERSUS_PAST, "policies_to_train": ["other"]}, "not one of the policies"),
        ({**VERSUS_PAST, "policy_mapping_fn": "no_such_module:f"}, "No module named"),
        ({**VERSUS_PAST, "policy_mapping_fn": f"{__name__}:nothing"}, "importable here"),
        (
            {
                **VERSUS_PAST,
                "policy_mapping_fn": "test_opponents:seat_one_past",
                "policies": ["main", "past", "third"],
            },
            None,
        ),
        ({"policies": ["main"], "policies_to_train": ["main"]}, "name an opponent policy"),
        ({**VERSUS_PAST, "self_play": False}, "invalid without self_play"),
        ({**VERSUS_PAST, "engine": "vllm"}, "only the hf engine"),
        ({**VERSUS_PAST, "policies": 3}, "must be a list of policy ids"),
    ],
)
def test_the_config_refuses_what_it_cannot_play(bad, says):
    cfg = tiny_config(**{**GAME, "policy_mapping_fn": "alternate", **bad})
    if says is None:  # a third policy nobody is seated as: allowed, and never played
        cfg.validate()
        assert cfg.opponent_setup.opponents == ("past", "third")
        assert {cfg.opponent_setup.seat(GameRef(k, 0))[1] for k in range(6)} == {"past"}
        return
    with pytest.raises(ValueError, match=says):
        cfg.validate()


def test_a_mapping_that_never_seats_the_trained_policy_is_refused():
    cfg = tiny_config(**GAME, **VERSUS_PAST)
    with pytest.raises(ValueError, match="policy_mapping_fn is not set"):
        cfg.validate()  # RLlib's default maps every agent to its default policy
    cfg.policy_mapping_fn = lambda agent_id, episode, **kw: "past"
    with pytest.raises(ValueError, match="never seats the trained policy 'main'"):
        cfg.validate()
    cfg.policy_mapping_fn = lambda agent_id, episode, **kw: "nobody"
    with pytest.raises(ValueError, match=r"returned \['nobody'\]"):
        cfg.validate()


@pytest.fixture(scope="module")
def against_past():
    cfg = tiny_config(
        **GAME, **VERSUS_PAST, policy_mapping_fn="alternate",
        opponent_snapshot_interval=2, opponent_pool_size=2,
    )  # fmt: skip
    cfg.validate()
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    yield runner
    runner.stop()


def _play(runner, seed=0):
    seeds, groups = [5] * 4 + [6] * 4, [0] * 4 + [1] * 4  # 4 games
    return runner.run_episodes(seeds, groups, SamplingParams(1.0, 1.0, 12), sample_seed=seed)


def test_only_the_trained_policys_trajectories_come_back(against_past):
    runner = against_past
    calls = {"main": 0, "past": 0}
    main_generate = runner.engine.generate

    def counted(prompts, *args, **kwargs):
        calls["main"] += len(prompts)
        return main_generate(prompts, *args, **kwargs)

    runner.engine.generate = counted
    try:
        trajs = _play(runner)
    finally:
        runner.engine.generate = main_generate
    assert len(trajs) == 4  # one seat of each of the 4 games
    seats = [t.turn_infos[0]["seat"] for t in trajs if t.turn_infos]
    assert seats == [0, 1, 0, 1]  # alternate: game k seats the trained policy at k % 2
    past = runner._opponents.engines["past"]
    assert past is not runner.engine and past.model is not runner.engine.model
    # Every answer of the returned trajectories came from the trained policy's engine.
    assert calls["main"] == sum(t.num_turns for t in trajs)


def test_games_are_numbered_by_group_and_a_stray_policy_id_is_refused(against_past):
    runner = against_past
    seen = []
    setup = runner._opponents.setup
    mapping = setup.mapping
    try:
        object.__setattr__(
            setup,
            "mapping",
            lambda agent_id, episode, **kw: (
                seen.append(episode.id_) or ("main" if agent_id == "player_0" else "past")
            ),
        )
        _play(runner)
        # groups 0 and 1 of 4 rollouts: 2 games each, numbered 0 1 and 2 3
        assert sorted(set(seen)) == [0, 1, 2, 3]
        object.__setattr__(setup, "mapping", lambda agent_id, episode, **kw: "stranger")
        with pytest.raises(ValueError, match=r"returned \['stranger'\] for game 0"):
            _play(runner)
    finally:
        object.__setattr__(setup, "mapping", mapping)


def test_an_opponent_that_cannot_play_fails_its_game(against_past):
    runner = against_past
    import ragen_envs.games.versus as versus

    step = versus.VersusEnv.step

    def broken(self, action):
        if self.seat == 1:
            raise RuntimeError("the opponent's env broke")
        return step(self, action)

    versus.VersusEnv.step = broken
    try:
        trajs = _play(runner)
    finally:
        versus.VersusEnv.step = step
    # Game k seats the trained policy at k % 2. Games 0 and 2: the opponent is at seat
    # 1, whose env broke, and the trained seat fails with it; games 1 and 3: the
    # trained seat is at seat 1 and fails on its own.
    assert len(trajs) == 4 and all(t.unplayable for t in trajs)
    partners = [t for t in trajs if "its opponent's seat failed" in t.error]
    assert [t.turn_infos[0]["seat"] for t in partners] == [0, 0]


def test_a_released_opponent_engine_is_woken_with_its_snapshot(against_past):
    """engine_sleep_level 2 frees the opponents' weights for the update too; the next
    game reloads the snapshot the engine held."""
    runner = against_past
    _play(runner)
    opponents = runner._opponents
    engine = opponents.engines["past"]
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    level = engine.sleep_level
    engine.sleep_level = 2  # as on a GPU beside the learner
    try:
        opponents.release()
        assert engine.asleep and all(p.numel() == 0 for p in engine.model.parameters())
        trajs = _play(runner)
    finally:
        engine.sleep_level = level
    assert not engine.asleep and len(trajs) == 4
    after = engine.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_snapshots_are_kept_on_the_interval_and_played(against_past):
    runner = against_past
    opponents = runner._opponents
    weights = {k: v.detach().clone() for k, v in runner.engine.model.state_dict().items()}
    name = next(k for k in weights if k.endswith("norm.weight"))
    for version in (1, 2, 3, 4):
        changed = dict(weights)
        changed[name] = torch.full_like(weights[name], float(version))
        runner.set_state({"rl_module": changed, "weights_seq_no": version})
    # Every 2nd update, the last 2 kept: the start's weights have left the pool.
    assert [v for v, _ in opponents.snapshots] == [2, 4]
    played = set()
    for seed in range(12):
        opponents.draw(seed)
        played.add(opponents.playing["past"])
        engine = opponents.engine("past")
        value = engine.model.state_dict()[name].float()
        assert torch.all(value == opponents.playing["past"])  # the drawn snapshot's weights
    assert played == {2, 4}
    assert INITIAL not in played


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "async"])
def test_two_iterations_train_against_snapshots(tmp_path, asynchronous):
    """Sampling in a runner actor while the learner updates (async_rollouts) plays the
    same games: the lag bound holds and only the trained seats are trained on."""
    base = tiny_dict(
        **{**GAME, "llm": "builtin-raw"}, env_groups=2, **VERSUS_PAST,
        policy_mapping_fn="alternate", opponent_snapshot_interval=1, opponent_pool_size=2,
    )  # fmt: skip
    if asynchronous:
        base.update(async_rollouts=True, num_env_runners=1, max_policy_lag=1)
    fields = """{"trained": learner["num_module_steps_trained"],
              "kept": r["env_runners"]["opponent/snapshots_kept"],
              "lag": r["rollout"].get("policy_lag_max", 0),
              "trajectories": r["rollout"]["num_trajectories"]}"""
    out = train_iterations(tmp_path, base, fields, iterations=3)
    rows = out["rows"]
    for row in rows:
        assert row["trajectories"] == row["trained"] == 4, row  # 8 seats, 4 trained
        assert row["lag"] <= 1, row
    kept = [row["kept"] for row in rows]
    assert kept[0] == 1 and kept[-1] == 2  # the start, then updates on the interval too
