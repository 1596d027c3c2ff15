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
    config = StarPOConfig.from_user_dict(
        {"env": "ragen/Bandit-v0", "llm": "builtin", "num_learners": 2}
    )
    assert "2 learner actors (ddp)" in header("demo", config, {}, str(tmp_path))
