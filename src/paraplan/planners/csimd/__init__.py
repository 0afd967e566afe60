"""CSIMD (../shared/papers/csimd.md): its algorithms (MASP, IMD, exact_rho, ODPA), the branch and bound
and searches over eq. (8), and the `csimd` and `csimd-paper` planners."""
