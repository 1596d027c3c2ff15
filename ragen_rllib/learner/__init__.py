"""The learner: StarPO's update on RLlib's TorchLearner (micro-batches, the
non-finite guard), its loss, its minibatches of whole trajectories, and what
changes under FSDP."""
