"""The `rllib` command's own surface: version, help, the header, and missing extras
named with their install line. No Ray."""

from __future__ import annotations

import argparse
import importlib.util

import pytest

from ragen_rllib.cli import main


def test_version_prints_the_installed_version(capsys):
    from importlib import metadata

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"ragen-rllib {metadata.version('ragen-rllib')}"


def test_every_argument_of_every_command_has_help():
    from ragen_rllib.cli import build_parser

    def walk(parser: argparse.ArgumentParser, path: str):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from walk(sub, f"{path} {name}")
            elif not isinstance(action, argparse._HelpAction):
                yield path, action

    missing = [
        f"{path}: {action.dest}"
        for path, action in walk(build_parser(), "rllib")
        if not action.help
    ]
    assert not missing


def test_report_without_matplotlib_names_the_install_line(monkeypatch, tmp_path, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a, **k: None if name == "matplotlib" else real(name, *a, **k),
    )
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "matplotlib" in err and '".[report]"' in err and "Traceback" not in err


def test_header_says_where_the_learner_runs_and_how_to_see_curves(tmp_path):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.cli.train import header

    config = StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0", "llm": "builtin"})
    text = header("demo", config, {}, str(tmp_path))
    assert "learners   1, in the trial's process (num_learners=0)" in text
    assert f"rllib report {tmp_path / 'demo'}" in text
    has_tb = importlib.util.find_spec("tensorboard") is not None
    assert ("tensorboard --logdir" in text) == has_tb
    assert "learner    rows packed, each prefix they share encoded once" in text
    config = StarPOConfig.from_user_dict(
        {"env": "ragen/Bandit-v0", "llm": "builtin", "num_learners": 2}
    )
    assert "2 learner actors (ddp)" in header("demo", config, {}, str(tmp_path))
    for off, why in (("share_prefixes", "rows packed, every row encoded in full"),
                     ("pack_sequences", "rows padded, every row encoded in full")):  # fmt: skip
        config = StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0", off: False})
        assert f"learner    {why}" in header("demo", config, {}, str(tmp_path))


def test_header_warns_when_the_agents_gateway_binds_beyond_loopback(tmp_path):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.cli.train import header

    agent = "tuned_examples/agents/bandit_agent.py:run"
    for host, warned in (("127.0.0.1", False), ("localhost", False), ("0.0.0.0", True)):
        config = StarPOConfig.from_user_dict({"agent": agent, "agent_gateway_host": host})
        text = header("demo", config, {}, str(tmp_path))
        assert ("WARNING    the agents' gateway listens on 0.0.0.0" in text) == warned, text


def test_model_dtype_auto_takes_bfloat16_only_where_it_is_native_and_pays(monkeypatch):
    """model_dtype: auto (the default) is float32 on a CPU without native bfloat16; with
    it, bfloat16 only for a model at least 512 wide (the built-in model, 128 wide, ran
    slower in bfloat16); the header's note says which and why; the engine follows
    unless engine_dtype is set."""
    from ragen_rllib.algorithms.starpo.config import starpo_config
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
    from ragen_rllib.models.runtime import native_bfloat16
    from ragen_rllib.planning.shapes import model_width

    assert native_bfloat16("cpu", {"avx2", "avx512f"}) is False
    assert native_bfloat16("cpu", {"avx512f", "avx512_bf16"}) is True
    assert native_bfloat16("cpu", {"amx_bf16", "amx_tile"}) is True
    assert model_width("builtin") == 128  # read from the shipped model's config
    for native, width, dtype, why in (
        (False, 576, "float32", "this CPU has no native bfloat16 (AVX512-BF16 or AMX)"),
        (True, 128, "float32", "the model is 128 wide: on a CPU bfloat16 pays from 512"),
        (True, 576, "bfloat16", "native on this CPU, and the model is 576 wide"),
        (True, None, "float32", "this model's config could not be read"),
    ):  # fmt: skip
        monkeypatch.setattr(starpo_config, "native_bfloat16", lambda device, n=native: n)
        monkeypatch.setattr(starpo_config, "model_width", lambda llm, w=width: w)
        config = StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0"})
        assert config.model_dtype == "auto" and config.model_dtype_used == dtype
        assert config.engine_dtype_used == dtype
        assert config.llm_module_config()["dtype"] == dtype
        assert config.dtype_note().startswith(f"{dtype}: auto, {why}"), config.dtype_note()
        pinned = StarPOConfig.from_user_dict(
            {"env": "ragen/Bandit-v0", "model_dtype": "float32", "engine_dtype": "bfloat16"}
        )
        assert (pinned.model_dtype_used, pinned.engine_dtype_used) == ("float32", "bfloat16")
        assert pinned.dtype_note() == "float32"


def test_an_agents_trial_is_named_after_the_agent_not_the_unused_env():
    from types import SimpleNamespace

    from ragen_rllib.cli.train import _agent_trial_dir

    for spec, name in (("tuned_examples/agents/search_agent.py:run", "search_agent-run"),
                       ("my_pkg.agents:play", "agents-play")):  # fmt: skip
        trial = SimpleNamespace(config={"agent": spec}, trainable_name="StarPO", trial_id="a1")
        assert _agent_trial_dir(trial) == f"StarPO_agent-{name}_a1"
