"""Models: resolving a config's ``llm`` (a local directory, a hub id, or the built-in
model), the built-in model itself (its spec, tokenizer, transcripts, pretraining,
quality checks and the build that ships it), and LoRA adapters. Imports no
learner code, so the env runners use it too."""
