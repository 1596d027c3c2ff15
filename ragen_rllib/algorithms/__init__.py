"""RLlib algorithms of this project, one folder each (as ``ray.rllib.algorithms``)."""
