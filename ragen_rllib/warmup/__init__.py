"""The format warm-up: a few supervised steps on the run's own first prompts that
make a run's starting weights (``format_warmup.py``; :func:`model_path` says which
folder a run trains)."""
