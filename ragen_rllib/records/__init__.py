"""Records that cross from the rollout side to the learner side: the trajectory, one
multi-turn episode as tokens. Imports nothing of the project, so the env runner, the
connectors, the learner and the algorithm all import it from below."""
