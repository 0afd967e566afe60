"""Bi-Partition (../shared/papers/bi-partition.md): separate forward and backward ranges per worker,
its dynamic programs and the planners `bipartition` and `pipedream-layerwise` (its baseline)."""
