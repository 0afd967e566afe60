"""FD-DPS (../shared/papers/fd-dps.md): the DAG placement problem, its timing with and without port
contention, the list-scheduling machinery, FD-DPS's scheduler, its baselines (FastT, HEFT, MP-DPS)
and the operator-placement planners."""
