"""Agent programs as the rollout: a user's program talks to the policy through an
OpenAI-style chat completions gateway, and each of its conversations becomes a
trajectory (the program runner, the gateway, its request batcher and schema, and the
conversation recorder)."""
