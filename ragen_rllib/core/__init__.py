"""Pure maths of StarPO / StarPO-S / TRICO: advantages, losses and rollout filters.

Nothing in this package imports Ray; every function works on padded torch
tensors (or array-likes) so it can be unit-tested by hand and reused by the
connectors (advantages, filters) and the learner (losses).
"""
