"""Planner trust: every CSIMD function ends on degenerate input, returns a valid division, and meets
its oracle (brute force over every division) where one exists.

Inputs mix zeros, ties (small integers) and huge ratios (1e-9 next to 1e9), with K <= 7 layers so
that brute force is instant; stage counts go past K.
"""

import functools
import itertools
import signal
import time
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraplan.planners import pipeline_split, stage_division
from paraplan.planners.baselines import partition
from paraplan.planners.csimd import algorithms as csimd
from paraplan.planners.csimd import search as csimd_search
from paraplan.planners.csimd.search import SearchMethod
from paraplan.planners.registry import planner_names

planner_names()  # loads every planner: pipeline_split.solve finds "csimd" by name

# A hang guard for every test here (the reproductions below use 10 s); timings live in benchmarks/.
pytestmark = pytest.mark.timeout(120)

REL = 1e-9
EXAMPLE_LIMIT_S = 10.0  # one example takes milliseconds; this only turns a hang into a failure


class Hang(BaseException):
    """Not an Exception: hypothesis would otherwise shrink the example, and every retry would hang."""


@contextmanager
def ends_within(seconds: float = EXAMPLE_LIMIT_S):
    """Fail (without shrinking) when the body runs past `seconds`; restores any outer alarm."""
    def alarm(signum, frame):
        raise Hang(f"still running after {seconds} s: a loop that does not end")

    previous = signal.signal(signal.SIGALRM, alarm)
    outer_delay, outer_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer_delay:  # pytest-timeout's alarm, if any, keeps what was left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer_delay - (time.monotonic() - t0), 1e-3), outer_interval)


def each_example_ends(test):
    """Put under @given: every generated example runs inside `ends_within`."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        with ends_within():
            return test(*args, **kwargs)
    return run


times = st.one_of(
    st.sampled_from([0.0, 1e-9, 1e9]),  # zeros and huge ratios
    st.integers(0, 3).map(float),  # ties
    st.floats(0.0, 100.0, allow_subnormal=False),
)


@st.composite
def instances(draw, max_layers: int = 7):
    """(h_p, h_m, j_p, j_m, n_stages) with 1..max_layers layers and 1..K + 2 stages."""
    k = draw(st.integers(1, max_layers))
    arrays = [np.array(draw(st.lists(times, min_size=k, max_size=k))) for _ in range(4)]
    return (*arrays, draw(st.integers(1, k + 2)))


@st.composite
def multi_p_instances(draw, max_layers: int = 6):
    """Arrays with one row per candidate p (1, 2, 4, 8 or a prefix), and a stage count."""
    k = draw(st.integers(1, max_layers))
    ps = [1, 2, 4, 8][:draw(st.integers(1, 4))]
    arrays = [np.array(draw(st.lists(st.lists(times, min_size=k, max_size=k), min_size=len(ps),
                                     max_size=len(ps)))) for _ in range(4)]
    return arrays, ps, draw(st.integers(1, k + 2))


def assert_valid(cuts, n_layers: int, n_stages: int) -> None:
    """Cuts strictly increasing in 0..K-2, at most N - 1 of them."""
    cuts = tuple(cuts)
    assert all(isinstance(c, int) for c in cuts)
    assert all(0 <= c <= n_layers - 2 for c in cuts), cuts
    assert all(a < b for a, b in itertools.pairwise(cuts)), cuts
    assert len(cuts) <= n_stages - 1, cuts


def close(got: float, want: float, scale: float) -> bool:
    """Equal to a relative 1e-9, with an absolute slack for optima at or near zero."""
    return abs(got - want) <= REL * abs(want) + 1e-12 * scale + 1e-300


def scale_of(*arrays) -> float:
    return float(sum(np.sum(a) for a in arrays))


def every_division(n_layers: int, n_stages: int):
    for n in range(1, min(n_stages, n_layers) + 1):
        yield from itertools.combinations(range(n_layers - 1), n - 1)


# --------------------------------------------------------------------------- exact reproductions
@pytest.mark.timeout(10)
def test_imd_ends_when_all_compute_is_zero():
    zeros = np.zeros(3)
    d = csimd.imd(zeros, zeros, zeros, zeros, 2)
    assert d.objective == 0.0
    assert_valid(d.cuts, 3, 2)


@pytest.mark.timeout(10)
def test_exact_rho_ends_when_rho2_is_zero():
    d = csimd.exact_rho([1.0], [1.0], [0.0], [0.0], 1)
    assert d.cuts == () and d.rho1 == 1.0 and d.rho2 == 0.0


def _split_problem(h_p, h_m, j_p, j_m, n_stages):
    ps = (1, 2)
    rows = [np.array([x, x], dtype=float) for x in (h_p, h_m, j_p, j_m)]
    return pipeline_split.SplitProblem(batch=2, n_stages=n_stages, n_micro_values=ps, h_p=rows[0], h_m=rows[1],
                                       j_p=rows[2], j_m=rows[3], param_bytes=np.ones(len(h_p)))


@pytest.mark.timeout(10)
def test_the_csimd_planner_ends_on_one_layer_with_zero_time():
    problem = _split_problem([0.0], [0.0], [0.0], [0.0], 1)
    cuts, p, _ = pipeline_split.solve(problem, "csimd")
    assert cuts == () and p in (1, 2)


@pytest.mark.timeout(10)
def test_the_csimd_planner_ends_on_zero_compute_with_communication():
    problem = _split_problem([0.0] * 3, [1.0] * 3, [0.0] * 3, [0.0] * 3, 3)
    cuts, p, _ = pipeline_split.solve(problem, "csimd")
    assert cuts == ()  # every cut costs communication and saves no compute
    assert problem.time_s(cuts, p) == 0.0


# --------------------------------------------------------------------------- properties
@settings(deadline=None, max_examples=150)
@given(instances(), st.sampled_from([2, 10, 1000]))
@each_example_ends
def test_imd_ends_valid_and_within_property_3(case, eta):
    *a, n = case
    d = csimd.imd(*a, n, eta=eta)
    assert_valid(d.cuts, len(a[0]), n)
    opt = partition.brute_force_rho(*a, n).objective
    assert d.objective >= opt * (1 - REL)
    # Property 3: error <= eps + opt / (eta - 1), eps = 1e-7 of the bounds
    assert d.objective <= opt * (1 + 1 / (eta - 1)) * (1 + 1e-6) + 1e-12 * scale_of(*a)


@settings(deadline=None, max_examples=150)
@given(instances())
@each_example_ends
def test_exact_rho_is_the_brute_force_optimum_of_rho(case):
    *a, n = case
    d = csimd.exact_rho(*a, n)
    assert_valid(d.cuts, len(a[0]), n)
    assert close(d.objective, partition.brute_force_rho(*a, n).objective, scale_of(*a))
    assert d == stage_division.evaluate(*a, d.cuts)


@settings(deadline=None, max_examples=150)
@given(instances(), st.sampled_from([1, 2, 3, 16, 1000]))
@each_example_ends
def test_exact_time_is_the_brute_force_optimum_of_eq8(case, p):
    *a, n = case
    cuts = csimd_search.exact_time(*a, n, p)
    assert_valid(cuts, len(a[0]), n)
    want = stage_division.total_time(*a, partition.brute_force_time(*a, n, p), p)
    assert close(stage_division.total_time(*a, cuts, p), want, scale_of(*a) * p)


@settings(deadline=None, max_examples=100)
@given(multi_p_instances(), st.sampled_from(list(SearchMethod)))
@each_example_ends
def test_search_ends_valid_and_reports_eq8_for_every_method(case, method):
    q, ps, n = case
    k = q[0].shape[1]
    r = csimd_search.search(*q, ps, n, method=method, eta=10)
    assert_valid(r.cuts, k, n)
    row = ps.index(r.n_micro)
    assert close(r.time_s, stage_division.total_time(*(x[row] for x in q), r.cuts, r.n_micro), scale_of(*q) * 8)
    if method in (SearchMethod.AUTO, SearchMethod.EXACT_TIME):  # the optimum over every division and p
        optimum = min(stage_division.total_time(*(x[i] for x in q), c, p)
                      for i, p in enumerate(ps) for c in every_division(k, n))
        assert r.exact
        assert close(r.time_s, optimum, scale_of(*q) * 8)
        assert r.lower_bound_s <= r.time_s


@settings(deadline=None, max_examples=100)
@given(instances(), st.sampled_from([0.5, 1.0, 2.0]), st.sampled_from([0.5, 1.0, 2.0]))
@each_example_ends
def test_masp_ends_with_the_fewest_bins(case, f1, f2):
    *a, _ = case
    k = len(a[0])
    # limits around the instance's own sizes, so that both packable and unpackable ones occur
    v1, v2 = f1 * float(np.max(a[0])), f2 * float(np.max(a[2]))
    tau, cuts = csimd.masp(*a, v1, v2)
    # MASP lets a sum exceed a limit by csimd._TOL relative (rounding); the oracle does the same
    lim1, lim2 = v1 * (1 + csimd._TOL), v2 * (1 + csimd._TOL)
    fewest = next((len(c) + 1 for c in every_division(k, k)
                   if (d := stage_division.evaluate(*a, c)).rho1 <= lim1 and d.rho2 <= lim2), None)
    if fewest is None:
        assert tau > k
    else:
        assert tau == fewest
        assert_valid(cuts, k, tau)
        d = stage_division.evaluate(*a, cuts)
        assert d.rho1 <= v1 * (1 + REL) and d.rho2 <= v2 * (1 + REL)


def _min_max_cost(a, cuts) -> float:
    """The min-max DP's own objective: the slowest stage, max(compute, its cut's communication)."""
    comp, comm = partition._stage_table(*a)
    b = [0, *[c + 1 for c in cuts], len(a[0])]
    return max(max(comp[e] - comp[s], comm[e - 1]) for s, e in itertools.pairwise(b))


@settings(deadline=None, max_examples=150)
@given(instances())
@each_example_ends
def test_min_max_dp_and_recursion_are_the_brute_force_optimum_of_their_objective(case):
    *a, n = case
    k = len(a[0])
    oracle = min(_min_max_cost(a, c) for c in every_division(k, n))
    for divide in (partition.min_max_dp, partition.min_max_recursive):
        cuts = divide(*a, n)
        assert_valid(cuts, k, n)
        assert close(_min_max_cost(a, cuts), oracle, scale_of(*a))


@settings(deadline=None, max_examples=150)
@given(st.lists(times, min_size=1, max_size=7), st.integers(1, 9))
@each_example_ends
def test_balanced_1d_is_the_brute_force_min_max_split(weights, n):
    w = np.array(weights)
    cuts = partition.balanced_1d(w, n)
    assert_valid(cuts, len(w), n)

    def heaviest(c):
        b = [0, *[x + 1 for x in c], len(w)]
        return max(float(w[s:e].sum()) for s, e in itertools.pairwise(b))

    assert close(heaviest(cuts), min(heaviest(c) for c in every_division(len(w), n)), float(w.sum()))


@settings(deadline=None, max_examples=150)
@given(instances(), st.sampled_from([1, 2, 7, 1000]))
@each_example_ends
def test_brute_force_ends_valid_and_each_oracle_wins_its_own_objective(case, p):
    *a, n = case
    k = len(a[0])
    rho = partition.brute_force_rho(*a, n)
    time_cuts = partition.brute_force_time(*a, n, p)
    assert_valid(rho.cuts, k, n)
    assert_valid(time_cuts, k, n)
    assert stage_division.total_time(*a, time_cuts, p) <= stage_division.total_time(*a, rho.cuts, p) * (1 + REL)
    assert rho.objective <= stage_division.evaluate(*a, time_cuts).objective * (1 + REL)


@settings(deadline=None, max_examples=60)
@given(st.integers(1, 7), st.integers(1, 12), st.integers(0, 2**31))
@each_example_ends
def test_even_and_random_cuts_stay_valid_past_one_stage_per_layer(k, n, seed):
    assert_valid(partition.even(k, n), k, n)
    assert len(partition.even(k, n)) == min(k, n) - 1
    assert_valid(partition.random_cuts(k, n, np.random.default_rng(seed)), k, n)


@pytest.mark.parametrize("bad", [[-1.0, 1.0], [np.nan, 1.0], [np.inf, 1.0]])
def test_negative_or_non_finite_times_are_refused(bad):
    ones = np.ones(2)
    with pytest.raises(ValueError, match="finite and non-negative"):
        csimd.imd(np.array(bad), ones, ones, ones, 2)
    with pytest.raises(ValueError, match="finite and non-negative"):
        csimd_search.search(np.array([bad]), [ones], [ones], [ones], [1], 2)


@pytest.mark.timeout(10)
def test_imd_refuses_a_weight_grid_that_can_never_accept():
    ones = np.ones(3)
    with pytest.raises(ValueError, match="eta must be at least 2"):
        csimd.imd(ones, ones, ones, ones, 2, eta=1)


def test_fewer_than_one_stage_is_refused():
    ones = np.ones(3)
    for call in (lambda: csimd.imd(ones, ones, ones, ones, 0), lambda: partition.min_max_dp(ones, ones, ones, ones, 0),
                 lambda: csimd_search.search([ones], [ones], [ones], [ones], [1], 0)):
        with pytest.raises(ValueError, match="at least one stage"):
            call()


# --------------------------------------------------------------------------- bounded search time
def _analytic(k: int, batch: int = 512, seed: int = 0):
    """Per-layer times a + b x micro-batch with variation, activations and gradients to send."""
    rng = np.random.default_rng(seed)
    ps = [p for p in range(1, batch + 1) if batch % p == 0]
    fixed, slope = rng.uniform(20e-6, 60e-6, (4, k)), rng.uniform(0.7e-4, 1.3e-4, (4, k))
    slope[1] *= 0.3
    slope[3] *= 0.3
    q = [np.array([fixed[i] + slope[i] * batch / p for p in ps]) for i in range(4)]
    q[3][:, 0] = 0.0
    return q, ps


@pytest.mark.timeout(120)
def test_the_default_search_stays_fast_and_exact_at_llm_scale():
    # K = 300, N = 32 with every divisor of 512 as p: more than 13 minutes before the work bound
    # and the bound over p, well under a second now (the 120 s timeout only catches a blow-up).
    q, ps = _analytic(300)
    r = csimd_search.search(*q, ps, 32)
    assert r.exact and r.lower_bound_s == r.time_s
    row = ps.index(r.n_micro)
    rho_cuts = csimd.exact_rho(*(x[row] for x in q), 32).cuts
    assert r.time_s <= stage_division.total_time(*(x[row] for x in q), rho_cuts, r.n_micro) * (1 + REL)


def test_a_spent_work_limit_falls_back_to_exact_rho_and_says_so():
    q, ps = _analytic(40, batch=16, seed=3)
    r = csimd_search.search(*q, ps, 8, max_work=0)
    assert not r.exact and r.lower_bound_s < r.time_s
    assert_valid(r.cuts, 40, 8)
    # never worse than one stage at any p, nor than exact_rho's division for p at that p
    assert r.time_s <= csimd.odpa(*q, (), ps).min() * (1 + REL)
    for row, p in enumerate(ps):
        a = [x[row] for x in q]
        assert r.time_s <= stage_division.total_time(*a, csimd.exact_rho(*a, 8).cuts, p) * (1 + REL)
    full = csimd_search.search(*q, ps, 8)
    assert full.exact and full.time_s <= r.time_s * (1 + REL)
    assert r.lower_bound_s <= full.time_s * (1 + REL)


@pytest.mark.parametrize("seed", range(4))
def test_auto_agrees_with_the_unbounded_exact_search(seed):
    q, ps = _analytic(60, batch=64, seed=seed)
    auto = csimd_search.search(*q, ps, 8)
    exact = csimd_search.search(*q, ps, 8, method=SearchMethod.EXACT_TIME)
    assert auto.exact and exact.exact
    assert auto.time_s == pytest.approx(exact.time_s, rel=REL)


def test_search_method_is_a_str_enum_that_takes_plain_strings():
    assert [m.value for m in SearchMethod] == ["auto", "imd", "exact", "exact-time"]
    assert SearchMethod.EXACT_TIME == "exact-time" and SearchMethod("exact") is SearchMethod.EXACT_RHO
    q, ps = _analytic(8, batch=4)
    assert csimd_search.search(*q, ps, 3, method="imd") == csimd_search.search(*q, ps, 3, method=SearchMethod.IMD)
    with pytest.raises(ValueError, match="'auto', 'imd', 'exact', 'exact-time'"):
        csimd_search.search(*q, ps, 3, method="magic")


# --------------------------------------------------------------------------- honest names
# K = 3, N = 3, the same times for every p: the rho-only optimum (two cuts) takes 736 at p = 1,
# the eq. (8) optimum is one stage at 377, since every cut costs more communication than it saves.
GAP_CASE = dict(h_p=[60.0, 79, 52], h_m=[90.0, 98, 93], j_p=[53.0, 67, 66], j_m=[56.0, 81, 90])


def test_brute_force_time_finds_the_one_stage_optimum_the_rho_oracle_misses():
    a = list(GAP_CASE.values())
    best = min((stage_division.total_time(*a, partition.brute_force_time(*a, 3, p), p), p,
                partition.brute_force_time(*a, 3, p)) for p in (1, 2, 4))
    assert best == (377.0, 1, ())
    rho_cuts = partition.brute_force_rho(*a, 3).cuts
    assert rho_cuts == (0, 1) and stage_division.total_time(*a, rho_cuts, 1) == 736.0
    q = [np.array([x] * 3) for x in a]
    assert csimd_search.search(*q, [1, 2, 4], 3, method="imd", starts=[1]).time_s == 736.0  # csimd-paper
    assert csimd_search.search(*q, [1, 2, 4], 3).time_s == 377.0  # csimd


def test_brute_force_time_equals_exact_time_on_random_instances():
    rng = np.random.default_rng(11)
    for _ in range(60):
        k, n, p = int(rng.integers(1, 9)), int(rng.integers(1, 6)), int(rng.choice([1, 2, 3, 8, 64]))
        a = [rng.uniform(0, 100, k) for _ in range(4)]
        t_brute = stage_division.total_time(*a, partition.brute_force_time(*a, n, p), p)
        t_exact = stage_division.total_time(*a, csimd_search.exact_time(*a, n, p), p)
        assert t_exact == pytest.approx(t_brute, rel=REL)
