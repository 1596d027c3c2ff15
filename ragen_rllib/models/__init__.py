"""Models: resolving a config's ``llm`` to a folder (``resolve.py``: a local
directory, a hub id checked in seconds by ``hub.py``, a GGUF file converted by
``gguf.py``, or the built-in model of :mod:`ragen_rllib.builtin`), the model cache
(``cache_folder.py``), LoRA adapters (``lora.py``) and how a process runs models on
its hardware (``runtime.py``). Resolving a model loads no env, and nothing here is
learner code, so the env runners use it too."""
