"""CSIMD's algorithms against brute force, closed forms and the baselines."""

import itertools

import numpy as np
import pytest

from paraplan.costs import closed_forms as cf
from paraplan.planners import stage_division
from paraplan.planners.baselines import partition
from paraplan.planners.csimd import algorithms as csimd
from paraplan.planners.csimd import search as csimd_search


def _instance(rng, k):
    return [rng.uniform(50, 100, k) for _ in range(4)]  # CSIMD EX1: H^P, H^M, J^P, J^M ~ U[50, 100]


def test_imd_with_eta_1000_is_within_a_tenth_of_a_percent_of_brute_force():
    rng = np.random.default_rng(0)
    worst = 0.0
    for _ in range(120):
        k, n = int(rng.integers(5, 15)), int(rng.integers(2, 6))
        a = _instance(rng, k)
        opt = partition.brute_force_rho(*a, n).objective
        worst = max(worst, csimd.imd(*a, n, eta=1000).objective / opt)
    assert worst <= 1.001


def test_exact_mode_is_the_optimum():
    rng = np.random.default_rng(1)
    for _ in range(150):
        k, n = int(rng.integers(2, 14)), int(rng.integers(1, 6))
        a = [rng.uniform(0, 100, k) for _ in range(4)]  # wide spread, zeros allowed
        assert csimd.exact_rho(*a, n).objective == pytest.approx(partition.brute_force_rho(*a, n).objective, rel=1e-9)


def test_coarse_eta_is_worse_but_bounded_by_property_3():
    rng = np.random.default_rng(2)
    for _ in range(60):
        k, n = int(rng.integers(6, 14)), int(rng.integers(2, 5))
        a = _instance(rng, k)
        opt = partition.brute_force_rho(*a, n).objective
        # Property 3: error <= eps + opt / (eta - 1)
        assert csimd.imd(*a, n, eta=10).objective <= opt * (1 + 1 / 9) + 1e-6


def test_masp_by_hand():
    h_p, j_p = np.array([1.0, 2, 3, 4]), np.array([2.0, 2, 2, 2])
    zeros = np.zeros(4)
    # forward limit 5, backward 4: {1,2} {3} {4} -> cuts after layers 1 and 2
    assert csimd.masp(h_p, zeros, j_p, zeros, 5.0, 4.0) == (3, (1, 2))
    # communication: a cut after layer 1 costs 9 forward, over the limit, so the first bin ends
    # at layer 0 and the next one takes layers 1 and 2
    h_m = np.array([0.0, 9, 0, 0])
    assert csimd.masp(h_p, h_m, j_p, zeros, 5.0, 4.0) == (3, (0, 2))
    # the backward term of a cut after layer a is the gradient entering layer a + 1 (eq. (7))
    j_m = np.array([0.0, 0.0, 9.0, 0.0])
    tau, cuts = csimd.masp(h_p, zeros, j_p, j_m, 5.0, 4.0)
    assert 1 not in cuts
    # one layer over a limit: no packing
    assert csimd.masp(h_p, zeros, j_p, zeros, 3.5, 4.0)[0] > 4


def test_masp_is_the_fewest_bins():
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(2, 10))
        a = [rng.uniform(0, 10, k) for _ in range(4)]
        v1, v2 = rng.uniform(5, 30, 2)
        tau, cuts = csimd.masp(*a, v1, v2)
        fewest = None
        for m in range(1, k + 1):
            for c in itertools.combinations(range(k - 1), m - 1):
                d = stage_division.evaluate(*a, c)
                if d.rho1 <= v1 and d.rho2 <= v2:
                    fewest = m
                    break
            if fewest:
                break
        assert tau == fewest if fewest else tau > k
        if fewest:
            d = stage_division.evaluate(*a, cuts)
            assert d.rho1 <= v1 * (1 + 1e-9) and d.rho2 <= v2 * (1 + 1e-9)


def test_odpa_equals_eq8_for_every_p():
    rng = np.random.default_rng(4)
    for _ in range(30):
        k, n_p = int(rng.integers(4, 20)), 7
        q = [rng.uniform(1, 10, (n_p, k)) for _ in range(4)]
        ps = [1, 2, 4, 8, 16, 32, 64]
        cuts = sorted(rng.choice(k - 1, size=min(3, k - 1), replace=False).tolist())
        z = csimd.odpa(*q, cuts, ps)
        for r, p in enumerate(ps):
            one_by_one = cf.csimd_eq8(q[0][r], q[1][r], q[2][r], q[3][r], cuts, p)
            assert z[r] == pytest.approx(one_by_one, rel=1e-12)
            assert z[r] == pytest.approx(stage_division.total_time(q[0][r], q[1][r], q[2][r], q[3][r], cuts, p), rel=1e-12)


def _nonlinear_instance(rng, k, batch=64):
    """Per-layer time functions a + b * micro_batch: time is not proportional to batch size."""
    ps = [p for p in range(1, batch + 1) if batch % p == 0]
    fixed = [rng.uniform(0.1, 2.0, k) for _ in range(4)]
    slope = [rng.uniform(0.01, 0.3, k) for _ in range(4)]
    q = [np.array([f + s * batch / p for p in ps]) for f, s in zip(fixed, slope, strict=True)]
    return q, ps


def test_cross_search_is_never_worse_than_the_baselines():
    rng = np.random.default_rng(5)
    for _ in range(40):
        k, n = int(rng.integers(6, 16)), int(rng.integers(2, 5))
        q, ps = _nonlinear_instance(rng, k)
        found = csimd_search.search(*q, ps, n)
        assert found.time_s == pytest.approx(stage_division.total_time(*(x[ps.index(found.n_micro)] for x in q), found.cuts,
                                                              found.n_micro))

        def t(cuts, p):
            return stage_division.total_time(*(x[ps.index(p)] for x in q), cuts, p)

        baselines = []
        for p in (1, 4, 64):  # GPipe-E-1, -4, -BS
            baselines.append(t(partition.even(k, n), p))
        for _ in range(5):  # GPipe-R
            baselines.append(t(partition.random_cuts(k, n, rng), int(rng.choice(ps))))
        for p in ps:  # the DP and 1-D balance at every p
            row = [x[ps.index(p)] for x in q]
            baselines.append(t(partition.min_max_dp(*row, n), p))
            baselines.append(t(partition.balanced_1d(row[0] + row[2], n), p))
        assert found.time_s <= min(baselines) * (1 + 1e-9)


def test_dp_and_recursion_agree_and_beat_even_on_their_own_objective():
    rng = np.random.default_rng(6)
    for _ in range(40):
        k, n = int(rng.integers(2, 15)), int(rng.integers(1, 6))
        a = [rng.uniform(0, 10, k) for _ in range(4)]
        comp, comm = partition._stage_table(*a)

        def cost(cuts):
            b = [0, *[c + 1 for c in cuts], k]
            return max(max(comp[e] - comp[s], comm[e - 1]) for s, e in zip(b[:-1], b[1:], strict=True))

        dp, rec = partition.min_max_dp(*a, n), partition.min_max_recursive(*a, n)
        assert cost(dp) == pytest.approx(cost(rec))
        if n <= k:
            assert cost(dp) <= cost(partition.even(k, n)) + 1e-12


def test_balanced_1d_by_hand():
    assert partition.balanced_1d([1, 1, 1, 1, 4], 2) == (3,)
    assert partition.balanced_1d([5, 1, 1, 1, 1, 1], 2) == (0,)


def test_exact_time_is_the_optimum_of_eq8_for_one_p():
    rng = np.random.default_rng(7)
    for _ in range(100):
        k, n, p = int(rng.integers(2, 11)), int(rng.integers(1, 5)), int(rng.integers(1, 12))
        a = [rng.uniform(0, 10, k) for _ in range(4)]
        best = min(stage_division.total_time(*a, c, p) for m in range(1, min(n, k) + 1)
                   for c in itertools.combinations(range(k - 1), m - 1))
        assert stage_division.total_time(*a, csimd_search.exact_time(*a, n, p), p) == pytest.approx(best, rel=1e-9)


def test_the_papers_cross_search_converges_and_reports_eq8():
    rng = np.random.default_rng(8)
    for _ in range(20):
        k, n = int(rng.integers(6, 16)), int(rng.integers(2, 5))
        q, ps = _nonlinear_instance(rng, k)
        r = csimd_search.cross_search(*q, ps, n, start=1, method="imd")
        row = ps.index(r.n_micro)
        assert r.time_s == pytest.approx(stage_division.total_time(*(x[row] for x in q), r.cuts, r.n_micro))
        assert r.iterations >= 1
