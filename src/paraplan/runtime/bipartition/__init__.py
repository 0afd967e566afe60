"""Bi-Partition plans: each worker's own forward and backward ranges, run by its own 1F1B step."""
