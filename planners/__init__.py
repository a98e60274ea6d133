"""Parallelization search: the strategy space, MCMC (Comp x Comm) and alternating optimization."""
