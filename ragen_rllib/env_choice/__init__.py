"""Which envs a run plays: loading an env by id or module (local, user or remote
OpenEnv), the mixture of several (``env_mix``) and the evaluation suites. Imports the
env package and the prompt formats only."""
