"""The env runner: the RLlib EnvRunner that plays multi-turn trajectories with a
rollout engine, the trajectory record it writes, the prompts it renders, how it
finds the env, and the rollout metrics. Imports no learner code."""
