"""The alias graph (who shares storage, with which relation), block comparison and the staged copy search."""

DEFAULT_MIN_BYTES = 1024
"""Tensors smaller than this are never copy candidates (check --min-size, retie --min-size, policy
min-size): small tables (position biases, norms) are equal by construction more often than tied.
Here, not in detect, so the command line reads it without importing numpy."""
