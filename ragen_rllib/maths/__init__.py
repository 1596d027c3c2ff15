"""The pure maths of StarPO / StarPO-S / TRICO, with no Ray import: advantage
estimators and their registry, rollout filters, how batches are cut, how seeds are
derived, the collapse indicators and pass@k. Each function is tested on its own,
by hand-computed values. (The loss terms are the learner's: ``learner/loss_terms``.)"""
