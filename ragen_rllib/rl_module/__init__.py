"""The RL module: the actor (a causal LM) and an optional critic, as RLlib's
TorchRLModule, with how it scores responses and packs rows. It lives in the
learners; the env runners never import it."""
