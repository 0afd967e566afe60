"""What every rank shares, whatever kind of plan it runs: the run's settings, groups, optimizer and
device (rank_base), the model built and materialised on the rank's device (materialize), its batches
(data) and its precision (mixed_precision)."""
