"""The planners: the pieces every method shares at this level (the request, the planner table, the
judge, the lower bound, the stage-division objective, fast memory checks, the split planners' frame)
and one folder per method (csimd, gropipe, bipartition, galvatron, fddps, baselines), which never
import one another."""
