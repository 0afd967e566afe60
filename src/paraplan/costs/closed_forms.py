"""The papers' closed-form pipeline costs, as plain functions on numbers (numpy arrays).

They stay beside the simulator as independent oracles: the tests check the simulator against
each (CSIMD eqs. (1), (6), (8); GroPipe eqs. (1)-(7); Galvatron-BMW eqs. (5), (8)), and the
planners use the ones they search on (CSIMD eq. (8), GroPipe's dispersion, Galvatron's balance).

Index conventions: stages and layers are 0-based here; the papers count from 1.
"""

from __future__ import annotations

import numpy as np


# --------------------------------------------------------------------------- CSIMD
def csimd_eq1(forward_s, backward_s, n_micro: int) -> float:
    """CSIMD eq. (1), the classic pipeline time without communication:
        T_PP = (m - 1) (max F_i + max B_i) + sum (F_i + B_i)"""
    f, b = np.asarray(forward_s, float), np.asarray(backward_s, float)
    return float((n_micro - 1) * (f.max() + b.max()) + (f + b).sum())


def csimd_eq6(f_p, f_m, b_p, b_m, n_micro: int) -> float:
    """CSIMD eq. (6): makespan of MBPP (GPipe) with computation and communication:
        T = sum_k (F_k^P + F_k^M + B_k^P + B_k^M)
            + (p-1) max_k max(F_k^P, F_k^M) + (p-1) max_k max(B_k^P, B_k^M)
    F^P / B^P: forward / backward compute of stage k; F^M: sending stage k's output forward;
    B^M: sending the gradient between stage k and k+1 backward; F_N^M = B_N^M = 0."""
    f_p, f_m, b_p, b_m = (np.asarray(x, float) for x in (f_p, f_m, b_p, b_m))
    total = (f_p + f_m + b_p + b_m).sum()
    return float(total + (n_micro - 1) * np.maximum(f_p, f_m).max() + (n_micro - 1) * np.maximum(b_p, b_m).max())


def csimd_stage_arrays(h_p, h_m, j_p, j_m, cuts):
    """CSIMD eq. (7): stage arrays from layer arrays and the cut points alpha_1 < ... < alpha_{N-1}.

    Layer arrays, 0-based: h_p[k] forward compute of layer k, h_m[k] sending layer k's output,
    j_p[k] backward compute, j_m[k] sending the gradient of layer k's input back (so the gradient
    crossing the cut after layer a is j_m[a + 1], CSIMD's J^M_{alpha_i + 1}). `cuts` lists the
    last layer of every stage but the final one.
    """
    h_p, h_m, j_p, j_m = (np.asarray(x, float) for x in (h_p, h_m, j_p, j_m))
    bounds = [0, *[c + 1 for c in cuts], len(h_p)]
    f_p = np.array([h_p[a:b].sum() for a, b in zip(bounds, bounds[1:], strict=False)])
    b_p = np.array([j_p[a:b].sum() for a, b in zip(bounds, bounds[1:], strict=False)])
    f_m = np.array([h_m[c] for c in cuts] + [0.0])
    b_m = np.array([j_m[c + 1] for c in cuts] + [0.0])
    return f_p, f_m, b_p, b_m


def csimd_rho(h_p, h_m, j_p, j_m, cuts) -> tuple[float, float]:
    """rho_1 = max_k max(F_k^P, F_k^M) and rho_2 = max_k max(B_k^P, B_k^M) (CSIMD eq. (8))."""
    f_p, f_m, b_p, b_m = csimd_stage_arrays(h_p, h_m, j_p, j_m, cuts)
    return float(np.maximum(f_p, f_m).max()), float(np.maximum(b_p, b_m).max())


def csimd_eq8(h_p, h_m, j_p, j_m, cuts, n_micro: int) -> float:
    """CSIMD eq. (8): T(lambda, p) = sum_k (H_k^P + J_k^P) + sum_{i<N} (H^M_{alpha_i} + J^M_{alpha_i+1})
    + (p - 1) (rho_1 + rho_2)."""
    h_p, h_m, j_p, j_m = (np.asarray(x, float) for x in (h_p, h_m, j_p, j_m))
    cut_comm = sum(h_m[c] + j_m[c + 1] for c in cuts)
    rho1, rho2 = csimd_rho(h_p, h_m, j_p, j_m, cuts)
    return float((h_p + j_p).sum() + cut_comm + (n_micro - 1) * (rho1 + rho2))


# --------------------------------------------------------------------------- GroPipe
def gropipe_forward_time(stage_s, n_micro: int) -> float:
    """GroPipe eqs. (2)-(7) for identical micro-batches (t_{i,j} = t_j):
    n = argmax_j sum_i t_{i,j} (eq. 4); T_stable = m t_n (eq. 5);
    T_rising = sum_{p>n} t_p + sum_{q<n} t_q (eq. 6); T_F = T_stable + T_rising (eqs. 3, 7).
    Equal to the recursion T_{m,k} = t_{m,k} + max(T_{m,k-1}, T_{m-1,k}) of eq. (2)."""
    t = np.asarray(stage_s, float)
    n = int(np.argmax(t))
    return float(n_micro * t[n] + t[n + 1:].sum() + t[:n].sum())


def gropipe_recursion(stage_s, n_micro: int) -> float:
    """GroPipe eq. (2) evaluated literally: T_{i,j} = t_j + max(T_{i,j-1}, T_{i-1,j})."""
    t = np.asarray(stage_s, float)
    finish = np.zeros(len(t))
    for _ in range(n_micro):
        prev = 0.0
        for j in range(len(t)):
            finish[j] = t[j] + max(prev, finish[j])
            prev = finish[j]
    return float(finish[-1])


def gropipe_iteration_time(forward_s, backward_s, n_micro: int) -> float:
    """GroPipe eq. (1): T = T_F + T_B (backward computed like the forward, last stage first)."""
    return gropipe_forward_time(forward_s, n_micro) + gropipe_forward_time(np.asarray(backward_s)[::-1], n_micro)


def gropipe_dispersion(stage_s) -> float:
    """GroPipe eq. (8), as printed: PD = sum_i (T_i - mu)^k / (k mu), k the number of partitions.

    With an odd k the deviations keep their sign and can cancel; `gropipe_dispersion_abs` is the
    reading AMPA uses to stop (planners/gropipe/planner.py)."""
    t = np.asarray(stage_s, float)
    k, mu = len(t), t.mean()
    return float(((t - mu) ** k).sum() / (k * mu))


def gropipe_dispersion_abs(stage_s) -> float:
    """|T_i - mu| in place of (T_i - mu): non-negative for every k."""
    t = np.asarray(stage_s, float)
    k, mu = len(t), t.mean()
    return float((np.abs(t - mu) ** k).sum() / (k * mu))


# --------------------------------------------------------------------------- Galvatron-BMW
def galvatron_eq5(stage_s, n_micro: int) -> float:
    """Galvatron-BMW eq. (5): C(M, B) = (m - 1) max_i C(M_i, B_m) + sum_i C(M_i, B_m)."""
    c = np.asarray(stage_s, float)
    return float((n_micro - 1) * c.max() + c.sum())


def galvatron_balance_degree(stage_values) -> float:
    """Galvatron-BMW eq. (6): alpha = 1 - max_i X_i / sum_i X_i, in [0, 1 - 1/P]; 1 - 1/P is a
    perfect balance (X is a stage's time for alpha_t, its memory for alpha_m)."""
    x = np.asarray(stage_values, float)
    return float(1.0 - x.max() / x.sum())


def galvatron_eq8(stage_s, stage_sync_s, n_micro: int) -> float:
    """Galvatron-BMW eq. (8): the last micro-batch also carries the gradient sync C(M_i, 0):
        C(M, B, m) = (m - 1) max_i (C(M_i, B_m) - C(M_i, 0)) + sum_i C(M_i, B_m)
    `stage_s` is C(M_i, B_m) with the sync included, `stage_sync_s` is C(M_i, 0)."""
    c, c0 = np.asarray(stage_s, float), np.asarray(stage_sync_s, float)
    return float((n_micro - 1) * (c - c0).max() + c.sum())
