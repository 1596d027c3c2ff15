"""The trajectory record's earlier module path, kept so that checkpoints whose rollout
buffer was pickled before the record moved to :mod:`ragen_rllib.records.trajectory`
still restore. New code imports it from there."""

from ragen_rllib.records.trajectory import Segment, Trajectory, env_name  # noqa: F401
