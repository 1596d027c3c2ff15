"""Whether the run's context bound fits the model and the envs' first prompts,
checked before Ray starts.

``max_context_tokens`` bounds a trajectory's tokens. It must not pass the
positions the model was trained on (``max_position_embeddings`` in its
``config.json``), and each env's first prompt (the chat template, the system
message, the env's instructions and its first state) plus ``max_new_tokens``
must fit in it, or no turn could be played. Both fail here with one line naming
``max_context_tokens``, not later inside a Ray actor. The first prompt is that
of seed 0 of each env of the run; a later seed's longer first prompt ends its
trajectory during the run as ``context_overflow`` with no turn, and its group is
dropped from the update as an env error's is.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any

from ragen_rllib.chat.prompts import ChatFormat, render_turn, with_instructions
from ragen_rllib.env_choice.env_loading import actions_left_of, make_eval_env
from ragen_rllib.env_choice.env_mix import format_of, mix_entries


@functools.lru_cache(maxsize=4)
def _tokenizer(model_path: str) -> Any:
    """The tokenizer of a local model folder, read once per process: a grid's points,
    and the plan's note after the checks, need the same one (SmolLM2's takes 0.2 s to
    read). Only read from here: nothing changes it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def check_context_budget(config: Any, model_path: str) -> None:
    """ValueError naming ``max_context_tokens`` when it passes the model's positions or
    leaves no room for an env's first prompt. ``model_path`` is a local folder (a hub
    model not yet downloaded is not checked)."""
    config_file = os.path.join(model_path, "config.json")
    if not os.path.isfile(config_file):
        return
    with open(config_file) as f:
        positions = json.load(f).get("max_position_embeddings")
    bound = config.max_context_tokens
    if positions and bound > positions:
        raise ValueError(
            f"config max_context_tokens={bound} is invalid: the model ({config.llm!r}) has "
            f"max_position_embeddings={positions}; allowed: <= {positions}"
        )
    tokenizer = _tokenizer(model_path)
    for entry in mix_entries(config):
        tokens = len(first_prompt_ids(entry, config, tokenizer)[0])
        if tokens + config.max_new_tokens > bound:
            raise ValueError(
                f"config max_context_tokens={bound} is too small: the first prompt of "
                f"{entry.env} (seed 0) is {tokens} tokens and max_new_tokens is "
                f"{config.max_new_tokens}; allowed: >= {tokens + config.max_new_tokens}"
            )


def first_prompt_ids(
    entry: Any, config: Any, tokenizer: Any, seeds: range = range(1)
) -> list[list[int]]:
    """The token ids of ``entry``'s first prompt at each of ``seeds`` (seed 0 alone by
    default), as the runner builds them."""
    style = format_of(entry, config)
    chat = ChatFormat(tokenizer, style.system, style.prefill)
    env = make_eval_env(entry)
    try:
        prompts = []
        for seed in seeds:
            obs, info = env.reset(seed=seed)
            text = render_turn(1, obs, actions_left_of(info), None, style)
            prompts.append(chat.prompt_ids(with_instructions(env.unwrapped, text, style)))
    finally:
        env.close()
    return prompts


def shared_prompt_tokens(config: Any, model_path: str, seeds: int = 4) -> tuple[int, int] | None:
    """(the tokens every first prompt of the run begins with, the longest first prompt)
    over the first ``seeds`` seeds of each env of the run: what the learner's prefix
    tree encodes once for all the rows of a pass, and a group's first prompt, which
    its N first turns share. None where the tokenizer is not local (a hub model not
    downloaded yet)."""
    if not os.path.isdir(model_path):
        return None
    from ragen_rllib.engines.prefix_cache import common_prefix_length

    tokenizer = _tokenizer(model_path)
    prompts = [
        ids
        for entry in mix_entries(config)
        for ids in first_prompt_ids(entry, config, tokenizer, range(seeds))
    ]
    common = min(common_prefix_length(prompts[0], ids) for ids in prompts)
    return common, max(len(ids) for ids in prompts)
