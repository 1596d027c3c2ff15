"""An experiment file's flat ``config:`` mapping read into a StarPOConfig.

The keys are the knobs' (:mod:`.knobs`, YAML spellings such as ``lambda`` and
``framework`` included); any other key is an error that names close matches, or
lists the keys by group. The values are checked afterwards by :mod:`.checks`
(``StarPOConfig.validate``); grid points and the experiment's other sections are
read by ``ragen_rllib.cli.experiments``.
"""

from __future__ import annotations

import difflib
from typing import Any

from ragen_rllib.algorithms.starpo.config.knobs import KNOBS, RENAMED, key_listing, rllib_settings
from ragen_rllib.algorithms.starpo.config.rules import is_int

#: RLlib's YAML spellings of config attributes (``AlgorithmConfig.update_from_dict``
#: reads a value under either name); tests/test_config_yaml.py checks the map
#: against the installed RLlib.
RLLIB_KEY_ALIASES = {
    "callbacks": "callbacks_class",
    "create_env_on_driver": "create_env_on_local_worker",
    "custom_eval_function": "custom_evaluation_function",
    "framework": "framework_str",
    "input": "input_",
    "lambda": "lambda_",
    "num_cpus_for_driver": "num_cpus_for_main_process",
    "num_workers": "num_env_runners",
}

#: The line before the listing of every key in an unknown-key error.
KEY_LISTING_HEADER = "The keys, by group (rllib keys prints each with its default and rule):"


def config_from_user_dict(config_cls, config: dict[str, Any]):
    """A ``config_cls`` instance from a flat dict (YAML ``config:`` section).

    Keys are the knobs'; any other key is an error, and so is a value RLlib's
    ``update_from_dict`` rejects.
    """
    if not isinstance(config, dict):
        raise ValueError(
            f"config must be a mapping of key: value, got {type(config).__name__} {config!r}"
        )
    odd = [k for k in config if not isinstance(k, str)]
    if odd:
        raise ValueError(f"config keys must be strings, got {odd!r}")
    allowed = set(KNOBS)
    spelled: dict[str, str] = {}  # attribute -> the user's spelling
    unknown, unused = [], []
    for key in config:
        attr = RLLIB_KEY_ALIASES.get(key, key)
        if attr in spelled:
            raise ValueError(
                f"config keys {spelled[attr]!r} and {key!r} set the same setting; give one"
            )
        spelled[attr] = key
        if attr not in allowed:
            (unused if attr in rllib_settings() else unknown).append(key)
    if unknown or unused:
        names = sorted({k.key for k in KNOBS.values()} | allowed - {"framework_str"})
        hints = []
        for key in unknown + unused:
            close = difflib.get_close_matches(key, names, n=2)
            if key in RENAMED:
                hints.append(RENAMED[key])
            elif close:
                hints.append(f"{key!r}: did you mean {' or '.join(map(repr, close))}?")
        parts = []
        if unknown:
            parts.append(f"unknown config key(s) {sorted(unknown)}")
        if unused:
            parts.append(
                f"config key(s) {sorted(unused)} are RLlib AlgorithmConfig settings that "
                "StarPO does not take from an experiment file"
            )
        # A close spelling is the whole answer; without one, the keys that exist, by
        # group (docs/config.md has each with its default and rule).
        listing = "" if hints else f"\n{KEY_LISTING_HEADER}\n" + key_listing()
        raise ValueError(
            "; ".join(parts) + (f" ({'; '.join(hints)})" if hints else "") + "." + listing
        )
    out = config_cls()
    if config.get("env_mix") is not None:
        _derive_from_env_mix(out, config)
    for key, value in config.items():
        if key == "env_config":  # RLlib merges it into the default; a mapping only
            if not isinstance(value, dict):
                raise ValueError(
                    f"config env_config={value!r} is invalid: must be a mapping of env "
                    "constructor kwargs"
                )
            out.env_config = dict(value)
            continue
        try:
            out.update_from_dict({key: value})
        except Exception as err:  # noqa: BLE001 - whatever RLlib raises, name the key
            raise ValueError(
                f"config {key}={value!r} is invalid: RLlib's AlgorithmConfig rejects it "
                f"({type(err).__name__}: {err})"
            ) from err
    return out


def _derive_from_env_mix(out, config: dict[str, Any]) -> None:
    """With ``env_mix``: ``env`` is its first entry's id and ``env_groups`` the sum of
    its groups, unless the config sets them (then they must agree: env_checks.check_env_mix)."""
    mix = config["env_mix"]
    if not isinstance(mix, list | tuple) or not mix:
        return  # check_values names the key
    if "env" not in config and isinstance(mix[0], dict) and isinstance(mix[0].get("env"), str):
        out.env = mix[0]["env"]
    groups = [e.get("groups") if isinstance(e, dict) else None for e in mix]
    if "env_groups" not in config and all(is_int(g) and g >= 1 for g in groups):
        out.env_groups = sum(groups)
