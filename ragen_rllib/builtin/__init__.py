"""The built-in model and its training on the envs' texts: its build parameters
(``spec.py``), its word-level tokenizer (``tokenizer.py``), random-play transcripts
(``transcripts.py``), next-token pretraining (``pretraining.py``), the checks of
what it knows (``quality.py``), the shipped build and the cache (``model.py``,
weights in ``weights/``) and the build that ships it (``build.py``). Resolving
``llm: builtin`` comes here (:mod:`ragen_rllib.models.resolve`); resolving any
other model loads none of it, nor the env package it reads."""
