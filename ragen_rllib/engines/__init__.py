"""Rollout engines behind one contract (:mod:`ragen_rllib.engines.base`): the
Hugging Face engine (``hf``, the CPU default) and vLLM (``vllm``). They run
inside the env runners and import nothing of the learner."""
