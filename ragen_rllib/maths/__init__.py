"""The pure maths of StarPO / StarPO-S / TRICO, with no Ray import: advantage
estimators and their registry, losses, rollout filters, how batches are cut, and
how seeds are derived. Each function is tested on its own, by hand-computed
values."""
