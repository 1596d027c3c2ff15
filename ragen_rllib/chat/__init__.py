"""The prompt and chat format: how an env's observations become user messages and a
tokenizer's chat template turns them into token ids. It imports nothing of the
project, so the models, the engines and the env runner all build on it."""
