"""The env runner: the RLlib EnvRunner that plays multi-turn trajectories with a
rollout engine, the prompts it renders turn by turn, the context budget, the
curriculum and the rollout metrics. Imports no learner code."""
