"""The planners: which rows every rank reads at every step, as pure functions of the step,
the batch and the world (no I/O): the rank slice, mixing and shuffling, read-time choices,
token balancing (docs/design.md §11)."""
