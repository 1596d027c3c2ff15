"""Every knob is declared once, in the knob file of the room that reads it
(config/knobs_<room>.py): its default, rule and one line of documentation reach the
config class, the value checks, the unknown-key listing, docs/config.md and the config
fuzzer from that declaration alone. No Ray."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import test_config_fuzz as fuzz

import ragen_rllib
from ragen_rllib.algorithms.starpo.config import knobs
from ragen_rllib.algorithms.starpo.config.knob import Knob
from ragen_rllib.algorithms.starpo.config.rules import integer
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

ROOT = Path(__file__).resolve().parents[1]
BASE = {"env": "ragen/Bandit-v0", "llm": "builtin-raw"}


@pytest.fixture
def new_knob(monkeypatch):
    """One knob added the way a contributor adds one: a declaration, nothing else."""
    knob = Knob("zz_turn_budget", 3, integer(1, 9), "turns a test knob allows", group="rollout")
    monkeypatch.setitem(knobs.KNOBS, knob.name, knob)
    knobs.rebuild()
    yield knob
    monkeypatch.undo()
    knobs.rebuild()


def test_one_declaration_reaches_every_reader(new_knob):
    # the config class: its default, through the fluent API and a YAML file
    assert StarPOConfig().zz_turn_budget == 3
    assert StarPOConfig().training(zz_turn_budget=5).zz_turn_budget == 5
    assert StarPOConfig.from_user_dict({**BASE, "zz_turn_budget": 7}).zz_turn_budget == 7
    # the value checks: its rule, with its sentence and the key named
    with pytest.raises(
        ValueError, match=r"zz_turn_budget=12 is invalid: must be an integer in \[1, 9\]"
    ):
        StarPOConfig.from_user_dict({**BASE, "zz_turn_budget": 12}).check_values()
    # the unknown-key listing and the knob table
    with pytest.raises(ValueError) as err:
        StarPOConfig.from_user_dict({**BASE, "qqqqqqqq": 1})
    assert "zz_turn_budget" in str(err.value)
    row = next(line for line in knobs.knob_table().splitlines() if "zz_turn_budget" in line)
    assert "`3`" in row and "turns a test knob allows" in row and "[1, 9]" in row
    # the fuzzer: the key, its verdicts and its valid samples
    by_key, cross = fuzz.spec_from(knobs.KNOBS)
    assert "zz_turn_budget" in by_key and "zz_turn_budget" not in cross
    rule = by_key["zz_turn_budget"].rule
    assert [rule.ok(v) for v in (0, 1, 9, 10, 2.0, True)] == [
        False,
        True,
        True,
        False,
        False,
        False,
    ]
    rng = random.Random(0)
    assert all(1 <= fuzz.shaped_sample(rule, rng) <= 9 for _ in range(50))


def test_the_tables_are_derived_and_the_knob_gone_with_its_declaration(new_knob):
    assert knobs.STARPO_DEFAULTS["zz_turn_budget"] == 3 and "zz_turn_budget" in knobs.RULES
    knobs.KNOBS.pop("zz_turn_budget")
    knobs.rebuild()
    assert "zz_turn_budget" not in knobs.STARPO_DEFAULTS and "zz_turn_budget" not in knobs.RULES
    with pytest.raises(ValueError, match="unknown config key"):
        StarPOConfig.from_user_dict({**BASE, "zz_turn_budget": 3})


def test_docs_config_md_is_the_generated_table():
    """docs/config.md is `rllib keys`' output; regenerate it with
    `rllib keys > docs/config.md` after changing a knob."""
    assert (ROOT / "docs" / "config.md").read_text() == knobs.knob_table()


def test_every_knob_has_a_default_its_rule_allows_and_one_line_of_documentation():
    for name, knob in knobs.KNOBS.items():
        assert knob.doc and "\n" not in knob.doc, name
        assert knob.group, name
        if knob.default is not knobs.RLLIB_OWN:
            assert knob.rule.ok(knob.default), (name, knob.default)
    config = StarPOConfig()
    for name, default in {**knobs.STARPO_DEFAULTS, **knobs.RLLIB_DEFAULTS}.items():
        assert getattr(config, name) == default, name


def test_each_knob_file_is_one_rooms_and_each_group_one_files():
    """knobs_<room>.py names a folder of the package; knobs.ROOMS gathers every such file,
    and a group's knobs all sit in one of them (docs/config.md has each heading once)."""
    package = Path(ragen_rllib.__file__).parent
    rooms = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    files = {f.stem for f in (package / "algorithms/starpo/config").glob("knobs_*.py")}
    assert {f.removeprefix("knobs_") for f in files} <= rooms
    assert files == {m.__name__.rsplit(".", 1)[1] for m in knobs.ROOMS}
    owner: dict[str, object] = {}
    for module in knobs.ROOMS:
        for knob in module.ALL:
            assert owner.setdefault(knob.group, module) is module, knob.group
    assert sum(len(m.ALL) for m in knobs.ROOMS) == len(knobs.KNOBS)
