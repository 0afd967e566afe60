"""FD-DPS's scheduling core and its baselines (issue 14 items 4-5) on the abstract DAG problem:
EST/LST and critical paths by hand, replay equality, memory limits, brute-force optima, the
incremental state against the full pass, HEFT's published example."""

import itertools
import math

import numpy as np
import pytest

from paraplan.planners.fddps.baselines import merge_nodes, schedule_fastt, schedule_heft, schedule_mpdps
from paraplan.planners.fddps.critical_path import critical_path_times
from paraplan.planners.fddps.dps import schedule_fddps
from paraplan.planners.fddps.problem import DagProblem, DagProblemError, device_peaks, peak_memory, replay


def fddps_earliest_finish(problem):
    return schedule_fddps(problem, fallback="earliest_finish")


SCHEDULERS = [schedule_fddps, fddps_earliest_finish, schedule_fastt, schedule_heft, schedule_mpdps]
IDS = ["fddps", "fddps-ef", "fastt", "heft", "mpdps"]


def problem_of(exec_s, edges, *, alpha=0.0, beta=math.inf, resident=None, output=None, capacity=math.inf,
               names=None):
    """edges: (src, dst, bytes); scalar link parameters are the same for every device pair."""
    exec_s = np.asarray(exec_s, dtype=float)
    n, d = exec_s.shape
    src, dst, nbytes = (list(x) for x in zip(*edges, strict=True)) if edges else ([], [], [])
    return DagProblem(exec_s, src, dst, nbytes, np.broadcast_to(alpha, (d, d)), np.broadcast_to(beta, (d, d)),
                      np.zeros(n) if resident is None else resident, np.zeros(n) if output is None else output,
                      np.broadcast_to(capacity, (d,)), names)


def random_problem(seed, n, d, *, p_edge=0.35, homogeneous=False, zeros=True, capacity=math.inf):
    rng = np.random.default_rng(seed)
    edges = [(a, b, float(rng.uniform(0, 4e3))) for a in range(n) for b in range(a + 1, n) if rng.random() < p_edge]
    row = rng.uniform(0.5, 6.0, size=(n, 1))
    exec_s = np.repeat(row, d, axis=1) if homogeneous else rng.uniform(0.5, 6.0, size=(n, d))
    if zeros:
        exec_s[rng.random(n) < 0.1] = 0.0
    alpha = rng.uniform(0.0, 1.0, size=(d, d))
    beta = rng.uniform(1e3, 4e3, size=(d, d))
    return DagProblem(exec_s, [e[0] for e in edges], [e[1] for e in edges], [e[2] for e in edges], alpha, beta,
                      rng.uniform(0, 10, n), rng.uniform(0, 5, n), np.full(d, capacity))


def check_valid(problem, schedule):
    """Replay equality (dependencies and device order included) and a complete placement."""
    again = replay(problem, schedule.device, schedule.order)
    assert np.array_equal(again.start_s, schedule.start_s)
    assert np.array_equal(again.finish_s, schedule.finish_s)
    assert again.makespan_s == schedule.makespan_s
    assert sorted(i for seq in schedule.order for i in seq) == list(range(problem.n_nodes))
    for a, b, nb in zip(problem.edge_src, problem.edge_dst, problem.edge_bytes, strict=True):
        ka, kb = schedule.device[a], schedule.device[b]
        assert schedule.start_s[b] >= schedule.finish_s[a] + problem.transfer_s(ka, kb, nb)
    assert np.array_equal(peak_memory(problem, schedule), schedule.peak_bytes)


def brute_force(problem) -> float:
    """The least makespan over every placement and every per-device order (= every global
    topological order appended device by device, which is what `replay` times)."""
    n, d = problem.n_nodes, problem.n_devices
    lists = problem.lists
    best = [math.inf]

    def grow(done, device, finish, free, span):
        if span >= best[0]:
            return
        if len(done) == n:
            best[0] = span
            return
        for i in range(n):
            if i in done or any(p not in done for p, _ in lists.parents[i]):
                continue
            for k in range(d):
                s = free[k]
                for p, nb in lists.parents[i]:
                    s = max(s, finish[p] + problem.transfer_s(device[p], k, nb))
                f = s + lists.et[i][k]
                grow(done | {i}, {**device, i: k}, {**finish, i: f}, free[:k] + (f,) + free[k + 1:], max(span, f))

    grow(frozenset(), {}, {}, (0.0,) * d, 0.0)
    return best[0]


# --- 1. the problem and replay -----------------------------------------------------------------

def test_problem_validation():
    with pytest.raises(DagProblemError, match="topological"):
        problem_of([[1.0], [1.0]], [(1, 0, 0.0)], names=["a", "b"])
    with pytest.raises(DagProblemError, match="topological"):
        problem_of([[1.0]], [(0, 0, 0.0)])
    with pytest.raises(DagProblemError, match="exec_s"):
        problem_of([[-1.0]], [])
    with pytest.raises(DagProblemError, match="link_bytes_per_s"):
        problem_of([[1.0, 1.0]], [], beta=0.0)
    with pytest.raises(DagProblemError, match="resident_bytes"):
        problem_of([[1.0], [1.0]], [(0, 1, 0.0)], resident=[1.0])
    with pytest.raises(DagProblemError, match="names"):
        problem_of([[1.0]], [], names=["a", "b"])
    ok = problem_of([[1.0, 2.0]], [])
    assert (ok.n_nodes, ok.n_devices, ok.n_edges) == (1, 2, 0)
    assert not ok.exec_s.flags.writeable


def test_replay_by_hand_and_deadlock():
    # 0 -> 2 (10 bytes), 1 -> 2; link: 1 s + bytes / 5 B/s = 3 s
    p = problem_of([[2, 2], [1, 1], [4, 4]], [(0, 2, 10.0), (1, 2, 0.0)], alpha=1.0, beta=5.0)
    r = replay(p, [0, 1, 0], ((0, 2), (1,)))
    assert r.start_s.tolist() == [0, 0, 2] and r.finish_s.tolist() == [2, 1, 6] and r.makespan_s == 6
    r = replay(p, [1, 0, 0], ((1, 2), (0,)))
    assert r.start_s.tolist() == [0, 0, 5]  # node 0's output arrives at 2 + 1 + 10/5
    with pytest.raises(DagProblemError, match="deadlock"):
        replay(p, [0, 0, 0], ((2, 0, 1), (), ))
    with pytest.raises(DagProblemError, match="placed on device"):
        replay(p, [0, 0, 0], ((0, 1), (2,)))
    with pytest.raises(DagProblemError, match="no device's order"):
        replay(p, [0, 0, 0], ((0, 1), ()))


def test_peak_memory_rule():
    # a -> b, a -> c on device 0; c on device 1. a's output lives from a's finish to c's start.
    p = problem_of([[1, 1], [1, 1], [5, 5]], [(0, 1, 0.0), (0, 2, 0.0)], resident=[10, 20, 40],
                   output=[100, 1000, 7], alpha=2.0)
    r = replay(p, [0, 0, 1], ((0, 1), (2,)))
    assert r.start_s.tolist() == [0, 1, 3]
    # device 0: residents 30; a alive [1, 3], b alive [2, 2] (nobody consumes b): peak 1100 at t = 2
    # device 1: resident 40; c alive [8, 8]
    assert device_peaks(p, [0, 0, 1], r.start_s, r.finish_s).tolist() == [1130, 47]


# --- 2. EST / LST / critical paths ---------------------------------------------------------------

def test_est_lst_diamond_by_hand():
    # 0 -> {1, 2} -> 3, ET 2, 3, 5, 1 on both devices, every unscheduled transfer 1 s
    p = problem_of([[2, 2], [3, 3], [5, 5], [1, 1]], [(0, 1, 0.0), (0, 2, 0.0), (1, 3, 0.0), (2, 3, 0.0)], alpha=1.0)
    cp = critical_path_times(p)
    assert cp.est.tolist() == [0, 3, 3, 9] and cp.dcpl == 10
    assert cp.lst.tolist() == [0, 5, 3, 9]
    assert cp.critical.tolist() == [True, False, True, True] and cp.path == (0, 2, 3)
    # place 0 and 2 on device 0: their edge costs nothing now, EST(3) = max(3 + 3 + 1, 2 + 5 + 1)
    cp = critical_path_times(p, [0, -1, 0, -1], ((0, 2), ()))
    assert cp.est.tolist() == [0, 3, 2, 8] and cp.dcpl == 9 and cp.path == (0, 2, 3)
    assert cp.lst.tolist() == [0, 4, 2, 8]


def test_figure3_critical_paths():
    # The paper's Figure 3 numbers are not in its text; this instance (ET per device, 5 s per
    # transfer) reproduces its two critical paths: o1-o3-o4 of 53 and o1-o2-o4 of 35.
    p = problem_of([[5, 5], [10, 15], [8, 33], [5, 5]], [(0, 1, 0.0), (0, 2, 0.0), (1, 3, 0.0), (2, 3, 0.0)],
                   alpha=5.0, names=["o1", "o2", "o3", "o4"])
    fig_b = critical_path_times(p, [0, 0, 1, 0], ((0, 1, 3), (2,)))  # o2 on Device0, o3 on Device1
    assert fig_b.dcpl == 53 and fig_b.path == (0, 2, 3)
    assert replay(p, [0, 0, 1, 0], ((0, 1, 3), (2,))).makespan_s == 53
    fig_c = critical_path_times(p, [0, 1, 0, 0], ((0, 2, 3), (1,)))  # o3 on Device0, o2 on Device1
    assert fig_c.dcpl == 35 and fig_c.path == (0, 1, 3)
    assert fig_c.critical.tolist() == [True, True, False, True]
    best = brute_force(p)
    for scheduler in SCHEDULERS:
        s = scheduler(p)
        check_valid(p, s)
        assert s.makespan_s >= best


# --- 3. every scheduler: validity, one device, memory -------------------------------------------

@pytest.mark.parametrize("scheduler", SCHEDULERS, ids=IDS)
def test_replay_equality_on_random_dags(scheduler):
    for seed in range(12):
        p = random_problem(seed, n=25, d=3 + seed % 3)
        check_valid(p, scheduler(p))
    for seed in range(3):  # identical devices: ties everywhere
        p = random_problem(100 + seed, n=40, d=4, homogeneous=True)
        check_valid(p, scheduler(p))


@pytest.mark.parametrize("scheduler", SCHEDULERS, ids=IDS)
def test_one_device_runs_everything_back_to_back(scheduler):
    for seed in range(4):
        p = random_problem(seed, n=30, d=1)
        s = scheduler(p)
        check_valid(p, s)
        assert s.makespan_s == pytest.approx(p.exec_s.sum(), rel=1e-12)


@pytest.mark.parametrize("scheduler", SCHEDULERS, ids=IDS)
def test_tight_memory_forces_spreading(scheduler):
    # a chain of four 40-byte nodes on two 100-byte devices: any schedule keeps both busy holding two
    p = problem_of([[1, 1]] * 4, [(0, 1, 8.0), (1, 2, 8.0), (2, 3, 8.0)], alpha=0.5, beta=16.0,
                   resident=[40.0] * 4, capacity=100.0)
    s = scheduler(p)
    check_valid(p, s)
    assert s.feasible and s.reason is None
    assert sorted(np.bincount(s.device, minlength=2).tolist()) == [2, 2]
    assert (s.peak_bytes <= 100).all()
    loose = scheduler(problem_of([[1, 1]] * 4, [(0, 1, 8.0), (1, 2, 8.0), (2, 3, 8.0)], alpha=0.5, beta=16.0,
                                 resident=[40.0] * 4))
    assert loose.makespan_s <= s.makespan_s


@pytest.mark.parametrize("scheduler", SCHEDULERS, ids=IDS)
def test_impossible_memory_is_infeasible_with_a_reason(scheduler):
    p = problem_of([[1, 1]] * 3, [(0, 1, 0.0), (1, 2, 0.0)], resident=[10.0, 150.0, 10.0], capacity=100.0,
                   names=["embed", "huge_linear", "loss"])
    s = scheduler(p)
    check_valid(p, s)  # still a complete schedule, for the judge to show
    assert not s.feasible
    assert "huge_linear" in s.reason and "150 B" in s.reason and "no device has room" in s.reason


@pytest.mark.parametrize("scheduler", SCHEDULERS, ids=IDS)
def test_memory_ledger_is_an_upper_bound(scheduler):
    # capacities around the schedule's needs: a scheduler either fits (checked by the final peak)
    # or names a node; the final peak never exceeds what the ledger allowed
    for seed in range(10):
        base = random_problem(seed, n=30, d=3)
        loose = scheduler(base)
        cap = float(loose.peak_bytes.max()) * (0.6 + 0.05 * seed)
        p = random_problem(seed, n=30, d=3, capacity=cap)
        s = scheduler(p)
        check_valid(p, s)
        if s.feasible:
            assert (s.peak_bytes <= cap * (1 + 1e-12)).all()
        else:
            assert "no device has room" in s.reason


# --- 4. brute force on tiny graphs ----------------------------------------------------------------

def test_fddps_against_brute_force():
    gaps = []
    for seed in range(10):
        p = random_problem(seed, n=5 + seed % 2, d=2, p_edge=0.4)
        best = brute_force(p)
        for scheduler in SCHEDULERS:
            s = scheduler(p)
            check_valid(p, s)
            assert s.makespan_s >= best - 1e-9
        gaps.append(schedule_fddps(p).makespan_s / best)
    assert min(gaps) == pytest.approx(1.0)  # it does find optima, sometimes


@pytest.mark.parametrize("n", [2, 4, 6])
def test_chains_are_optimal(n):
    # identical devices: a chain's optimum is the sum of its ETs on one device, which FD-DPS finds
    for seed in range(3):
        rng = np.random.default_rng(seed)
        row = rng.uniform(0.5, 3.0, size=(n, 1))
        p = problem_of(np.repeat(row, 2, axis=1), [(i, i + 1, float(rng.uniform(0, 10))) for i in range(n - 1)],
                       alpha=0.3, beta=5.0)
        best = brute_force(p)
        assert best == pytest.approx(row.sum())
        for scheduler in (schedule_fddps, fddps_earliest_finish):
            assert scheduler(p).makespan_s == pytest.approx(best)


# --- 5. FD-DPS's incremental state against the full pass -----------------------------------------

@pytest.mark.parametrize("fallback", ["lowest_priority", "earliest_finish"])
def test_incremental_est_lst_match_full_recomputation(fallback):
    for seed in range(8):
        p = random_problem(seed, n=35, d=2 + seed % 3, p_edge=0.15)
        s = schedule_fddps(p, fallback=fallback, debug_check=True)  # raises on any disagreement
        check_valid(p, s)
        final = critical_path_times(p, s.device, s.order)
        assert final.dcpl == pytest.approx(s.makespan_s)  # eq. (10) with everything placed
        assert np.array_equal(final.est, s.start_s)


def test_fddps_tracks_the_critical_nodes():
    p = random_problem(7, n=40, d=3, p_edge=0.2)
    s = schedule_fddps(p)
    assert s.stats["critical_picks"] >= 1
    assert sum(s.stats[k] for k in ("rule1_parent", "rule4_fallback", "no_room")) <= p.n_nodes


def test_rule4_fallback_option():
    # sparse graphs on unequal devices push nodes past their LST everywhere (rule (4)); the paper's
    # "device running the lowest-priority node" ignores when that device is free, earliest finish not
    ratios, fired = [], 0
    for seed in range(20):
        p = random_problem(seed, n=30, d=3, p_edge=0.08)
        paper, better = schedule_fddps(p), schedule_fddps(p, fallback="earliest_finish")
        fired += paper.stats["rule4_fallback"]
        ratios.append(better.makespan_s / paper.makespan_s)
    assert fired > 0
    assert np.exp(np.mean(np.log(ratios))) < 0.95


# --- 6. HEFT's published example; MP-DPS's merging -----------------------------------------------

def test_heft_topcuoglu_example():
    # Topcuoglu, Hariri, Wu (2002), Fig. 2: 10 tasks, 3 processors, communication = data (rate 1)
    et = [[14, 16, 9], [13, 19, 18], [11, 13, 19], [13, 8, 17], [12, 13, 10], [13, 16, 9], [7, 15, 11],
          [5, 11, 14], [18, 12, 20], [21, 7, 16]]
    edges = [(1, 2, 18), (1, 3, 12), (1, 4, 9), (1, 5, 11), (1, 6, 14), (2, 8, 19), (2, 9, 16), (3, 7, 23),
             (4, 8, 27), (4, 9, 23), (5, 9, 13), (6, 8, 15), (7, 10, 17), (8, 10, 11), (9, 10, 13)]
    p = problem_of(et, [(a - 1, b - 1, float(c)) for a, b, c in edges], beta=1.0)
    s = schedule_heft(p)
    check_valid(p, s)
    assert s.makespan_s == 80
    # the published schedule: n1 P3 0-9, n3 P3 9-28, n4 P2 18-26, n2 P1 27-40, n5 P3 28-38,
    # n6 P2 26-42, n9 P2 56-68, n7 P3 38-49, n8 P1 57-62, n10 P2 73-80
    assert s.device.tolist() == [2, 0, 2, 1, 2, 1, 2, 0, 1, 1]
    assert s.start_s.tolist() == [0, 27, 9, 18, 28, 26, 38, 57, 56, 73]


def test_mpdps_merging():
    # a 6-chain with a side branch: the chain merges until the work cap; groups never form a cycle
    p = problem_of([[1, 1]] * 8, [(0, 1, 0.0), (1, 2, 0.0), (2, 3, 0.0), (3, 4, 0.0), (4, 5, 0.0), (0, 6, 0.0),
                                  (6, 7, 0.0), (5, 7, 0.0)])
    # cap: 8 work / (2 devices x 1) = 4 per group; node 6 finds its parent's group full, 7 has two
    assert merge_nodes(p, groups_per_device=1) == [0, 0, 0, 0, 1, 1, 2, 3]
    for seed in range(6):
        q = random_problem(seed, n=60, d=3, p_edge=0.06)
        group = merge_nodes(q, groups_per_device=2)
        assert len(set(group)) < q.n_nodes
        assert all(group[a] <= group[b] for a, b in zip(q.edge_src, q.edge_dst, strict=True))  # a topological labelling
        s = schedule_mpdps(q, groups_per_device=2)
        check_valid(q, s)
        for seq in s.order:  # a group runs contiguously
            labels = [group[i] for i in seq]
            assert all(labels.count(g) == len(list(grp)) for g, grp in itertools.groupby(labels))
