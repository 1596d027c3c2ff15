"""What a run records, declared below every role that writes or reads it: the
trajectory, one multi-turn episode as tokens (the env runner writes it; the
connectors, the learner and the algorithm read it), and the metric declarations
(each metric's definition and reductions). Imports nothing of the project."""
