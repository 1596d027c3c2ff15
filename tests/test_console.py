"""The console: the third-party notices this project hides are hidden, at their source
(the real Ray, RLlib and Tune code that prints them), and nothing else is."""

from __future__ import annotations

import logging

import pytest

from ragen_rllib.console import no_progress_bars, quiet


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def collect():
    attached = []

    def on(name: str) -> Collect:
        handler = Collect()
        logging.getLogger(name).addHandler(handler)
        attached.append((name, handler))
        return handler

    yield on
    for name, handler in attached:
        logging.getLogger(name).removeHandler(handler)


def test_starpo_config_validates_without_the_new_api_stack_warning(collect):
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    got = collect("ray.rllib.algorithms.algorithm_config")
    StarPOConfig.from_user_dict({"env": "ragen/Bandit-v0", "llm": "builtin"}).validate()
    assert not [m for m in got.messages if "new API stack" in m]


def test_token_auth_notice_hidden_and_the_disabled_warning_kept(collect):
    from ray._private.authentication import authentication_token_setup as setup

    quiet()
    got = collect(setup.logger.name)
    setup._warn_token_auth_enabled()
    setup._warn_token_auth_disabled()
    assert len(got.messages) == 1 and "disabled" in got.messages[0]


def test_gputil_notice_hidden_without_a_gpu(collect):
    import torch
    from ray.tune.utils import util

    if torch.cuda.is_available():
        pytest.skip("the notice is kept where a GPU exists")
    quiet()
    got = collect(util.logger.name)
    monitor = util.UtilMonitor(start=True)
    monitor.stop()
    util.logger.warning("Install psutil to monitor system performance.")  # another notice
    assert got.messages == ["Install psutil to monitor system performance."]


def test_no_progress_bars_restores_the_setting():
    from transformers.utils import logging as hf_logging

    hf_logging.enable_progress_bar()
    with no_progress_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()


def test_the_progress_line_shows_every_evaluation_suite(capsys):
    """An evaluating iteration's line has the fixed states' success and each suite
    env's; other iterations have no evaluation part."""
    from ragen_rllib.cli.train import _print_progress

    progress = _print_progress()
    trial = type("Trial", (), {"trial_id": "t0"})()
    suite = {"train": {"success_rate": 1.0}, "held_out": {"success_rate": 0.005},
             "rev": {"success_rate": 0.0, "pass@4": 0.0}}  # fmt: skip
    evaluation = {"success_rate": 0.996, "num_states": 256, "bandit": suite}
    for result in ({"training_iteration": 19}, {"training_iteration": 20,
                                                "evaluation": evaluation}):  # fmt: skip
        progress.on_trial_result(0, [], trial, result)
    lines = capsys.readouterr().out.splitlines()
    assert "eval" not in lines[0]
    assert lines[1].endswith(
        " | eval success 0.996 (bandit: train 1.000, held_out 0.005, rev 0.000)"
    ), lines[1]
