"""A StarPO checkpoint's actor as a plain Hugging Face model directory (``rllib export``).

What comes out loads with ``AutoModelForCausalLM.from_pretrained(dir)`` and with
vLLM, with no part of this project installed: ``config.json``, the weights as
safetensors, the tokenizer with its chat template, and the generation config.
LoRA adapters are merged into the weights (W = W0 + alpha / rank * B A), so the
model is the one the checkpoint's actor computes; the log-probabilities of the
exported model equal the checkpoint's. The critic is left out, or written to
``critic/`` beside it (its transformer as a Hugging Face ``AutoModel``
directory and the value head as ``value_head.safetensors``). ``ragen_rllib.json``
records how the model was prompted and sampled in training (each env's prompt
wording and prefill, the context window, the token budget, the temperatures), so
that it can be served as it was trained. The folder and its files get the
permissions of the user's umask, like any file they write.

A checkpoint is read without starting Ray: the RL module's constructor arguments
and state are unpickled from the algorithm checkpoint (from the learner's own
folder, or from the learner group's state when FSDP learners saved it), after
:func:`~ragen_rllib.algorithms.starpo.checkpoint.verify_checkpoint` has checked
every file against the checkpoint's manifest.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from ragen_rllib.algorithms.starpo.config.knobs_models import DTYPES
from ragen_rllib.rl_module.llm_rl_module import LLMRLModule

#: Where RLlib keeps an algorithm checkpoint's RL module, and its learner group.
_MODULE_DIR = Path("learner_group", "learner", "rl_module", DEFAULT_MODULE_ID)
_GROUP_STATE = Path("learner_group", "state.pkl")


def _load(path: Path) -> Any:
    with open(path, "rb") as f:
        return pickle.load(f)


def _run_config(root: Path):
    """The ``StarPOConfig`` the checkpoint's run was trained with."""
    from ragen_rllib.algorithms.starpo.starpo import StarPOConfig

    args = _load(root / "class_and_ctor_args.pkl")["ctor_args_and_kwargs"][0]
    return StarPOConfig().update_from_dict(args[0])


def _module_config(root: Path) -> dict[str, Any]:
    """The RL module's model_config, from its own folder or from the algorithm's config.

    The base model is the one recorded at training time; when that folder is gone
    (another machine, a reinstalled package), the config's ``llm`` is resolved
    again here."""
    ctor = root / _MODULE_DIR / "class_and_ctor_args.pkl"
    if ctor.is_file():
        module_config = dict(_load(ctor)["ctor_args_and_kwargs"][1]["model_config"])
        if os.path.isdir(module_config["model_path"]):
            return module_config
    resolved = _run_config(root).llm_module_config()
    if not ctor.is_file():
        return resolved
    return {**module_config, "model_path": resolved["model_path"]}


def _module_state(root: Path) -> dict[str, Any]:
    own = root / _MODULE_DIR / "module_state.pkl"
    if own.is_file():
        return _load(own)
    # FSDP learners: the learner group saved the gathered learner state itself.
    return _load(root / _GROUP_STATE)["learner"]["rl_module"][DEFAULT_MODULE_ID]


def training_settings(checkpoint: str | os.PathLike) -> dict[str, Any]:
    """How the checkpoint's run prompted and sampled the model (``ragen_rllib.json``)."""
    from dataclasses import asdict

    from ragen_rllib.env_choice.env_mix import format_of, mix_entries

    config = _run_config(Path(checkpoint))
    keys = ("llm", "max_turns", "max_new_tokens", "max_context_tokens", "context_window",
            "temperature", "top_p", "eval_temperature")  # fmt: skip
    return {
        **{k: getattr(config, k) for k in keys},
        "envs": [
            {
                "name": entry.name,
                "env": entry.env,
                "env_config": entry.env_config,
                "prompt": asdict(format_of(entry, config)),
            }
            for entry in mix_entries(config)
        ],
    }


def load_module(checkpoint: str | os.PathLike) -> LLMRLModule:
    """The learner's RL module (actor, and critic if it had one) of an algorithm
    checkpoint, with the checkpoint's weights. The checkpoint is verified first."""
    from ragen_rllib.algorithms.starpo.checkpoint import verify_checkpoint

    root = Path(checkpoint)
    verify_checkpoint(root)
    if not (root / _MODULE_DIR).is_dir() and not (root / _GROUP_STATE).is_file():
        raise FileNotFoundError(
            f"{str(root)!r} is not a StarPO algorithm checkpoint (no {_MODULE_DIR} and no "
            f"{_GROUP_STATE}); pass a checkpoint_NNNNNN folder of a training run"
        )
    config = _module_config(root)
    module = LLMRLModule(observation_space=None, action_space=None, model_config=config)
    module.set_state(_module_state(root))
    module.eval()
    return module


def export_module(
    module: LLMRLModule,
    out: str | os.PathLike,
    *,
    with_critic: bool = False,
    dtype: str = "float32",
    settings: dict[str, Any] | None = None,
) -> list[str]:
    """Write ``module``'s actor (LoRA merged) as a Hugging Face model directory ``out``
    (created; it must not exist or be empty), and with ``with_critic`` its critic to
    ``out/critic``, and ``settings`` (:func:`training_settings`) as
    ``ragen_rllib.json``. Returns the files written, relative to ``out``. The module is
    spent: its adapters are merged and its weights cast in place."""
    from transformers import AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{str(out)!r} exists and is not empty; choose a new folder")
    if with_critic and not module.has_critic:
        raise ValueError("the checkpoint has no critic (its estimator is critic-free)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))
    try:
        actor = _merged(module.actor, module.lora is not None)
        actor.to(getattr(torch, dtype)).save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(module.model_config["model_path"])
        tokenizer.save_pretrained(tmp)
        if with_critic:
            from safetensors.torch import save_file

            critic = _merged(module.critic, module.lora is not None)
            critic.to(getattr(torch, dtype)).save_pretrained(tmp / "critic")
            head = {k: v.detach().to(getattr(torch, dtype)).contiguous()
                    for k, v in module.value_head.state_dict().items()}  # fmt: skip
            save_file(head, str(tmp / "critic" / "value_head.safetensors"))
        if settings is not None:
            (tmp / "ragen_rllib.json").write_text(json.dumps(settings, indent=2) + "\n")
        _as_umask_allows(tmp)
        if out.exists():
            out.rmdir()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


def _as_umask_allows(root: Path) -> None:
    """Folders and files as a plain ``mkdir`` and ``open`` would make them (a temporary
    folder is owner-only)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def _merged(net: torch.nn.Module, lora: bool) -> torch.nn.Module:
    """``net`` with its LoRA adapters merged into the base weights (``net`` itself
    when there are none). The merge runs in float32: under ``model_dtype: bfloat16``
    the learner holds its frozen base in bfloat16, and adding the float32 update to
    a bfloat16 weight would round the update before the export's own cast."""
    return net.float().merge_and_unload() if lora else net
