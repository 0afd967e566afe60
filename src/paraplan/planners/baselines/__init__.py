"""Baselines several methods are compared with: the partition baselines (GPipe-E, GPipe-R,
DeepSpeed, torchgpipe, PipeDream and the exhaustive oracle) as split planners."""
