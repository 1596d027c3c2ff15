"""The placement and memory planner: model shapes from config.json, where each piece
goes on the described hardware, each device's memory, and the commands that print
them (rllib plan, rllib train file --dry-run). No Ray, no weights."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import private_env, tiny_config
from transformers import AutoConfig, AutoModelForCausalLM

from ragen_rllib.cli.experiments import UsageError
from ragen_rllib.cli.plan import parse_size
from ragen_rllib.models.resolve import resolve_model
from ragen_rllib.planning.memory import GIB, learner_lines, workload
from ragen_rllib.planning.placement import Hardware, PlacementError, gpus_asked, plan
from ragen_rllib.planning.render import render
from ragen_rllib.planning.shapes import KNOWN_CONFIGS, ModelShape, known_shape, load_shape

ROOT = Path(__file__).resolve().parents[1]
QWEN = "Qwen/Qwen2.5-0.5B-Instruct"


def h100(gpus: int = 1, nodes: int = 1) -> Hardware:
    return Hardware(nodes, gpus // nodes, 80 * GIB, f"--gpus {gpus}")


@pytest.mark.parametrize("name", sorted(KNOWN_CONFIGS))
def test_parameter_counts_equal_the_models_built_from_the_same_config(name):
    """Counted from the shape = counted from a model built (on the meta device) from
    the same config, for every known shape and the built-in model."""
    cfg = AutoConfig.from_pretrained(resolve_model("builtin"))  # a Qwen2 config
    for key, value in KNOWN_CONFIGS[name].items():
        setattr(cfg, key, value)
    cfg.head_dim = cfg.hidden_size // cfg.num_attention_heads
    cfg.layer_types = ["full_attention"] * cfg.num_hidden_layers
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    real = sum(p.numel() for p in model.parameters())  # a tied head once
    assert known_shape(name).params() == real


def test_the_builtin_models_shape_is_read_from_its_config_json():
    shape = load_shape("builtin")
    model = AutoModelForCausalLM.from_pretrained(resolve_model("builtin"))
    assert shape.source == "config.json"
    assert shape.params() == sum(p.numel() for p in model.parameters())
    # The published size of Qwen2.5-0.5B: 494M parameters (0.49B).
    assert round(known_shape(QWEN).params() / 1e6) == 494


def test_a_config_without_the_sizes_is_refused_by_name():
    with pytest.raises(ValueError, match="'hidden_size'"):
        ModelShape.from_config({"vocab_size": 10}, "odd")


def test_sizes_parse_and_bad_ones_are_refused():
    assert parse_size("24GiB") == 24 * GIB and parse_size("80GB") == 80 * 10**9
    assert parse_size("40G") == 40 * GIB
    for bad in ("lots", "-3GiB", "24 TB", ""):
        with pytest.raises(UsageError, match="--gpu-memory"):
            parse_size(bad)


def sokoban(**overrides):
    """The paper's setup as in tuned_examples/sokoban_starpo.yaml (one GPU)."""
    base = {
        "env": "ragen/SimpleSokoban-v0",
        "llm": "builtin",
        "model_dtype": "bfloat16",
        "num_gpus_per_learner": 1,
        "env_groups": 8,
        "group_size": 16,
        "max_turns": 5,
        "max_new_tokens": 200,
        "minibatch_size": 32,
        "filter_keep_ratio": 0.25,
        "advantage_estimator": "gae",
        "gradient_checkpointing": True,
        "max_tokens_per_microbatch": 16384,
    }
    return tiny_config(**{**base, **overrides})


def test_one_gpu_colocates_learner_and_engine_and_counts_the_sleep():
    shape = known_shape(QWEN)
    laid = plan(sokoban(), shape, h100())
    assert laid.layout == "colocated" and len(laid.pieces) == 1 and len(laid.devices) == 1
    driver = laid.pieces[0]
    assert driver.gpu == "GPU 0" and "learner" in driver.holds and "engine (hf)" in driver.holds
    dev = laid.devices[0]
    rollout = {x.component for x in dev.phases["rollout"]}
    update = {x.component for x in dev.phases["update"]}
    # While sampling: the learner's weights and optimizer state stay, no gradients, no
    # activations; during the update the engine (level 2) holds nothing.
    assert "gradients (fp32)" not in rollout and "engine KV buffer" in rollout
    # The critic (gae) likewise: its weights and AdamW state stay, its gradients do not.
    assert "critic (weights, AdamW)" in rollout and "critic gradients (fp32)" not in rollout
    assert {"critic (weights, AdamW)", "critic gradients (fp32)"} <= update
    assert "activations (one micro-batch)" in update and not any("engine" in c for c in update)
    level0 = plan(sokoban(engine_sleep_level=0), shape, h100())
    assert level0.devices[0].peak() > dev.peak()  # the engine stays during the update
    assert dev.fits()


def test_split_async_places_runners_and_learners_on_their_own_gpus():
    laid = plan(
        sokoban(num_env_runners=1, num_gpus_per_env_runner=1, async_rollouts=True, num_learners=1),
        known_shape(QWEN),
        h100(2),
    )
    assert laid.layout == "split"
    gpus = {p.name: (p.node, p.gpu) for p in laid.pieces}
    assert gpus["learner 0"][1] != gpus["runner 1"][1]
    assert sorted(d.label for d in laid.devices if "GPU" in d.label) == [
        "node 0 GPU 0",
        "node 0 GPU 1",
    ]


def test_eight_gpus_on_two_nodes_shard_the_learner_state_with_fsdp():
    shape = known_shape("Qwen/Qwen2.5-7B-Instruct")
    config = sokoban(
        llm="builtin",
        num_learners=6,
        learner_strategy="fsdp",
        num_env_runners=2,
        num_gpus_per_env_runner=1,
        async_rollouts=True,
        advantage_estimator="grpo",
    )
    laid = plan(config, shape, h100(8, nodes=2))
    learners = [p for p in laid.pieces if p.name.startswith("learner")]
    assert len(learners) == 6 and {p.node for p in learners} == {0, 1}
    assert any("span nodes" in n for n in laid.notes)
    one = learner_lines(config, shape, 6, workload(config, 6))
    full = learner_lines(config.copy(copy_frozen=False), shape, 1, workload(config, 1))
    adam = {x.component: x.bytes for x in one}["AdamW moments (fp32)"]
    assert adam == {x.component: x.bytes for x in full}["AdamW moments (fp32)"] // 6


def test_a_checkpointed_critic_adds_its_layer_inputs_not_a_second_recomputed_layer():
    """Checkpointing recomputes one layer of one model at a time: the critic adds its
    kept layer inputs; without checkpointing it adds as much as the actor keeps."""
    shape = known_shape(QWEN)

    def lines(**kw):
        config = sokoban(**kw)
        got = learner_lines(config, shape, 1, workload(config, 1))
        return {x.component: x.bytes for x in got}, workload(config, 1)

    ckpt, load = lines()
    inputs = shape.layers * load.microbatch_tokens * shape.hidden * 2  # bf16
    gathered = shape.layers * load.gathered_positions * 2 * shape.kv_dim * 2
    assert ckpt["critic activations"] == inputs + gathered
    assert ckpt["activations (one micro-batch)"] > inputs
    full, _ = lines(gradient_checkpointing=False)
    assert full["critic activations"] == full["activations (one micro-batch)"]


def test_single_turn_groups_encode_their_prompt_once_per_microbatch():
    """P groups of N answers to one prompt each: the actor's transformer runs each
    prompt once and every row's answer (shared prefixes, also with checkpointing and
    FSDP); the worst case of several turns counts no sharing, and share_prefixes:
    false none at all."""
    base = dict(
        env="ragen/Bandit-v0", max_turns=1, env_groups=4, group_size=8, minibatch_size=32,
        max_context_tokens=256, max_new_tokens=24, max_tokens_per_microbatch=None,
    )  # fmt: skip
    load = workload(tiny_config(**base), 1)
    assert load.rows_per_microbatch == 32 and load.shared_prompts == 4
    assert load.microbatch_tokens == 4 * (256 - 24) + 32 * 24
    assert load.full_tokens == 32 * 256
    for other in ({"max_turns": 3}, {"share_prefixes": False}):
        load = workload(tiny_config(**{**base, **other}), 1)
        assert load.shared_prompts == 0 and load.microbatch_tokens == load.full_tokens
    fsdp = tiny_config(**base, num_learners=2, learner_strategy="fsdp")
    assert workload(fsdp, 2).shared_prompts == 2
    assert workload(tiny_config(**base, gradient_checkpointing=True), 1).shared_prompts == 4


def test_shared_prefixes_bound_a_pass_by_the_tokens_it_encodes():
    """With shared prefixes max_tokens_per_microbatch bounds the tokens a pass encodes:
    more rows fit in a pass (up to GATHERED_PER_ENCODED times the bound in padded
    size), their activations are counted for the bound, and the keys and values the
    attention gathers are counted on top; without sharing rows are bounded padded."""
    from ragen_rllib.maths.batching import GATHERED_PER_ENCODED, QUERY_CHUNK

    shape = known_shape(QWEN)
    base = dict(env="ragen/FrozenLake-v0", max_turns=5, minibatch_size=64,
                max_context_tokens=512, max_tokens_per_microbatch=2048,
                model_dtype="float32")  # fmt: skip
    shared = workload(tiny_config(**base), 1)
    plain = workload(tiny_config(**base, share_prefixes=False), 1)
    assert plain.rows_per_microbatch == 2048 // 512 and plain.encoded_bound is None
    assert shared.rows_per_microbatch == GATHERED_PER_ENCODED * 2048 // 512
    assert shared.encoded_bound == 2048 and shared.microbatch_tokens == 2048
    assert plain.microbatch_tokens == 2048 and plain.gathered_positions == 0
    chunks = 2048 // QUERY_CHUNK + shared.rows_per_microbatch
    assert shared.gathered_positions == chunks * 512

    def act(config, load):
        lines = learner_lines(config, shape, 1, load)
        return {x.component: x.bytes for x in lines}["activations (one micro-batch)"]

    extra = shape.layers * chunks * 512 * 2 * shape.kv_dim * 4  # float32
    config = tiny_config(**base)
    assert act(config, shared) == act(config, plain) + extra


@pytest.mark.parametrize("window", [None, 0, 1, 2])
def test_the_plans_tree_count_is_the_prefix_tree_of_a_worst_case_batch(window):
    """tree_tokens' arithmetic = the learner's prefix tree built on a batch laid out
    as it assumes: one system prefix, a first observation per group, then per
    trajectory its own answers and later observations, every turn played in full."""
    import numpy as np

    from ragen_rllib.maths.batching import prefix_tree
    from ragen_rllib.planning.memory import tree_tokens

    common, own, answer, turns, groups, size = 7, 5, 3, 4, 2, 3
    config = tiny_config(env_groups=groups, group_size=size, max_turns=turns,
                         max_new_tokens=answer, context_window=window,
                         max_tokens_per_microbatch=None)  # fmt: skip
    fresh = iter(range(1000, 10**6))  # every token not shared is a new one

    def new(n):
        return [next(fresh) for _ in range(n)]

    rows, system = [], list(range(common))
    for _ in range(groups):
        first = new(own)
        for _ in range(size):
            turns_text = [(first if t == 0 else new(own)) + new(answer) for t in range(turns)]
            if window is None:
                rows.append(system + sum(turns_text, []))
            else:
                for t in range(turns):
                    rows.append(system + sum(turns_text[max(0, t - window) : t + 1], []))
    lengths = np.array([len(r) for r in rows])
    ids = np.zeros((len(rows), lengths.max()), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    assert tree_tokens(config, common, common + own) == (
        int(lengths.sum()), prefix_tree(ids, lengths).encoded,
    )  # fmt: skip


def test_rllib_plan_says_what_the_prefix_tree_saves():
    """The real model's FrozenLake config: the line names the shared system prefix
    read from the run's own first prompts; without sharing there is no line."""
    from ragen_rllib.cli.plan import tree_note

    config = tiny_config(env="ragen/FrozenLakeNoSlip-v0", max_turns=6)
    note = tree_note(config)
    assert note is not None and "prefix tree: an update of" in note
    found = re.search(r"trains up to ([\d,]+) row tokens and encodes about ([\d,]+)", note)
    rows, encoded = (int(x.replace(",", "")) for x in found.groups())
    assert 0 < encoded < rows
    assert tree_note(tiny_config(env="ragen/FrozenLakeNoSlip-v0", share_prefixes=False)) is None


def test_a_cpu_plan_counts_rays_processes_and_the_evaluation_batch():
    """On CPU memory the driver's figure holds Ray's own processes (what a process-tree
    RSS reads), and a run that evaluates gets an evaluation phase whose engine holds
    min(states x samples, rollout_batch_size) rows."""
    shape = known_shape(QWEN)
    cpu = Hardware(1, 0, None, "this machine", cpu_bytes=64 * GIB)
    config = tiny_config(eval_interval=5, eval_num_states=300, max_context_tokens=512)
    dev = plan(config, shape, cpu).devices[0]
    assert "Ray (head node)" in {x.component for x in dev.phases["update"]}
    kv = {x.component: x.note for x in dev.phases["evaluation"]}["engine KV buffer"]
    assert kv == f"{config.rollout_batch_size} rows x 512 tokens"
    assert "evaluation" not in plan(tiny_config(eval_interval=0), shape, cpu).devices[0].phases


def test_more_gpus_than_there_are_is_a_clear_error():
    config = sokoban(num_learners=2, num_env_runners=1, num_gpus_per_env_runner=1)
    assert gpus_asked(config) == 3
    with pytest.raises(PlacementError, match="none is left.*2 GPU"):
        plan(config, known_shape(QWEN), h100(2))
    # num_env_runners 0: the engine is in the driver, which asks for no GPU of its own.
    assert gpus_asked(sokoban(num_gpus_per_env_runner=1)) == 1


def test_a_plan_that_does_not_fit_names_the_knob():
    laid = plan(
        sokoban(gradient_checkpointing=False, max_tokens_per_microbatch=None),
        known_shape(QWEN),
        Hardware(1, 1, 24 * GIB, "--gpus 1"),
    )
    assert not laid.fits()
    text = render(laid, known_shape(QWEN))
    assert "DOES NOT FIT" in text and "gradient_checkpointing: true" in text
    # Every large part's knob, not the largest alone. At the example's settings the
    # peak is the rollout's: the KV buffer first, then the learner state that stays.
    laid = plan(sokoban(), known_shape(QWEN), Hardware(1, 1, 16 * GIB, "--gpus 1"))
    text = render(laid, known_shape(QWEN))
    knobs = text.split("to fit: the knobs of its largest parts")[1].splitlines()[1:5]
    sizes = [float(k.split(" GiB)")[0].rsplit("(", 1)[1]) for k in knobs]
    assert len(knobs) == 4 and sizes == sorted(sizes, reverse=True) and sizes[-1] > 1, knobs
    assert any("critic (weights, AdamW)" in k for k in knobs), knobs


def test_a_plan_with_room_to_spare_says_what_it_could_buy():
    big = Hardware(1, 1, 80 * GIB, "--gpus 1")
    text = render(plan(sokoban(), known_shape(QWEN), big), known_shape(QWEN))
    assert "room:" in text and "gradient_checkpointing: false fits" in text
    # Not where checkpointing is already off, nor where the room is small.
    off = plan(sokoban(gradient_checkpointing=False), known_shape(QWEN), big)
    assert "room:" not in render(off, known_shape(QWEN))
    tight = plan(sokoban(), known_shape(QWEN), Hardware(1, 1, 24 * GIB, "--gpus 1"))
    assert "room:" not in render(tight, known_shape(QWEN))


def run_cli(tmp_path, *args):
    return subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", *args],
        cwd=tmp_path,
        env=private_env(tmp_path, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_dry_run_prints_the_plan_of_the_gpu_example_for_described_hardware(tmp_path):
    """The paper's example on one 80 GiB GPU, checked here without a GPU or the model's
    weights (the hub is off: the known shape is used)."""
    proc = run_cli(
        tmp_path,
        "train", "file", str(ROOT / "tuned_examples" / "sokoban_starpo.yaml"),
        "--dry-run", "--gpus", "1", "--gpu-memory", "80GiB",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "layout     colocated" in out and "known shape" in out
    assert "driver    node 0  GPU 0" in out and "fits" in out
    assert "OK (1 config(s) checked)" in out
    # The hub is off here, so the real run could not load the model: said, not failed.
    assert "the model does not load on this machine" in out and "Qwen/Qwen2.5-0.5B" in out


def test_rllib_plan_exits_1_when_a_device_does_not_fit(tmp_path):
    proc = run_cli(
        tmp_path,
        "plan", str(ROOT / "tuned_examples" / "sokoban_starpo.yaml"),
        "--gpus", "1", "--gpu-memory", "8GiB",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "DOES NOT FIT" in proc.stdout and "to fit:" in proc.stdout
    bad = run_cli(
        tmp_path,
        "plan",
        str(ROOT / "tuned_examples" / "bandit_cpu.yaml"),
        "--gpus",
        "3",
        "--nodes",
        "2",
    )
    assert bad.returncode == 2 and "--nodes" in bad.stderr
