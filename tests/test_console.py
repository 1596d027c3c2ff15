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
