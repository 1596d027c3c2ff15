"""``rllib export``: a trained checkpoint's actor as a plain Hugging Face model whose
log-probabilities equal the checkpoint's, with LoRA merged and the critic optional;
a corrupt checkpoint is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import learner_batch, private_env, run_script, tiny_config

from ragen_rllib.algorithms.starpo.checkpoint import CorruptCheckpointError
from ragen_rllib.algorithms.starpo.export import export_module, load_module
from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner
from ragen_rllib.rl_module.scoring import response_logprobs

pytestmark = pytest.mark.slow

#: Two short runs that move the weights (lr 1e-3): GRPO with full weights, and GAE
#: with rank-8 LoRA adapters on the actor and the critic.
RUNS = {
    "full": {"lr": 1e-3},
    "lora": {"lr": 1e-3, "lora_rank": 8, "lora_alpha": 16, "advantage_estimator": "gae"},
}
SCRIPT = """
import json, os, ray
from ragen_rllib.algorithms.starpo.starpo import StarPOConfig
ray.init(num_cpus=2, include_dashboard=False)
out = {}
for name, over in RUNS.items():
    algo = StarPOConfig.from_user_dict({**TINY, "llm": "builtin", **over}).build_algo()
    for _ in range(2):
        algo.train()
    out[name] = algo.save_to_path(os.path.abspath(name))
    algo.stop()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from conftest import TINY

    tmp = tmp_path_factory.mktemp("export")
    return run_script(SCRIPT, tmp, define={"TINY": TINY, "RUNS": RUNS}), tmp


def logprobs_of(model_or_module, batch, temperature=1.0):
    with torch.no_grad():
        if hasattr(model_or_module, "forward_train"):
            return model_or_module.forward_train(batch)["logp"]
        return response_logprobs(model_or_module, batch, temperature)["logp"]


@pytest.mark.parametrize("run", ["full", "lora"])
def test_the_export_loads_with_transformers_and_scores_as_the_checkpoint(checkpoints, run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    paths, tmp = checkpoints
    module = load_module(paths[run])
    out = tmp / f"exported-{run}"
    files = export_module(module, out)
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(
        files
    )
    assert not any(f.startswith("critic/") for f in files)
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template and tokenizer.eos_token_id == model.config.eos_token_id
    assert not any("lora" in name for name in model.state_dict())  # merged, plain weights
    # The same trajectories scored by the checkpoint's module and by the export.
    cfg = tiny_config(llm="builtin", **RUNS[run])
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    fresh = load_module(paths[run])  # export merged the adapters of `module` in place
    batch = learner_batch(cfg, fresh, trajs)
    mask = batch["response_mask"] > 0
    ours = logprobs_of(fresh, batch)
    theirs = logprobs_of(model, batch, cfg.temperature)
    assert mask.sum() > 10
    assert (ours - theirs)[mask].abs().max().item() <= 1e-5
    # Trained weights, not the base model's: the scores moved.
    base = AutoModelForCausalLM.from_pretrained(fresh.model_config["model_path"]).eval()
    assert (logprobs_of(base, batch) - theirs)[mask].abs().max().item() > 1e-3


def test_the_critic_is_written_beside_it_on_request(checkpoints):
    from safetensors.torch import load_file
    from transformers import AutoModel

    paths, tmp = checkpoints
    module = load_module(paths["lora"])
    cfg = tiny_config(llm="builtin", **RUNS["lora"])
    trajs = LLMEnvRunner(config=cfg, worker_index=0).sample()
    batch = learner_batch(cfg, module, trajs)
    with torch.no_grad():
        values = module.compute_values(batch)
    files = export_module(module, tmp / "with-critic", with_critic=True)
    assert {"critic/config.json", "critic/model.safetensors", "critic/value_head.safetensors"} <= (
        set(files)
    )
    critic = AutoModel.from_pretrained(tmp / "with-critic" / "critic").eval()
    head = load_file(str(tmp / "with-critic" / "critic" / "value_head.safetensors"))
    with torch.no_grad():
        hidden = critic(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        again = hidden[:, :-1] @ head["weight"].T + head["bias"]
    real = batch["attention_mask"][:, 1:] > 0
    assert (values[:, 1:] - again.squeeze(-1))[real].abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="no critic"):
        export_module(load_module(paths["full"]), tmp / "no-critic", with_critic=True)


def test_a_corrupt_checkpoint_or_a_used_folder_is_refused(checkpoints, tmp_path):
    import shutil

    paths, _ = checkpoints
    copy = tmp_path / "ckpt"
    shutil.copytree(paths["full"], copy)
    state = copy / "learner_group" / "learner" / "rl_module" / "default_policy" / "module_state.pkl"
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    with pytest.raises(CorruptCheckpointError, match="module_state.pkl"):
        load_module(copy)
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "export", str(copy), str(tmp_path / "out")],
        env=private_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "module_state.pkl" in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out").exists()
    used = Path(tmp_path / "used")
    used.mkdir()
    (used / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        export_module(load_module(paths["full"]), used)
    assert (used / "keep.txt").read_text() == "mine"


def test_the_cli_export_records_the_training_prompt_with_the_users_permissions(
    checkpoints, tmp_path
):
    """`rllib export` writes the folder as the user's umask allows (not owner-only) and
    ragen_rllib.json: the run's prompt wording, prefill and sampling settings."""
    import json
    import os

    from conftest import TINY

    paths, _ = checkpoints
    out = tmp_path / "served"
    proc = subprocess.run(
        [sys.executable, "-m", "ragen_rllib.cli", "export", paths["full"], str(out)],
        env=private_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask
    for f in out.iterdir():
        assert f.stat().st_mode & 0o777 == 0o666 & ~umask, f
    settings = json.loads((out / "ragen_rllib.json").read_text())
    assert settings["temperature"] == 1.0 and settings["max_new_tokens"] == TINY["max_new_tokens"]
    (env,) = settings["envs"]
    assert env["env"] == TINY["env"]
    assert env["prompt"]["prefill"] == "<think>" and "{observation}" in env["prompt"]["turn"]
