"""Connectors: the sample-batch stage the driver runs on a whole rollout batch
(:mod:`~ragen_rllib.connectors.sample_batch`) and the learner stage each learner
runs on its shard (:mod:`~ragen_rllib.learner.connectors`)."""
