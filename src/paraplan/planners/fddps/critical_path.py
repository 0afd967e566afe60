"""The critical-path numbers of the DAG schedulers (FD-DPS and its baselines; planners/fddps/
list_scheduling.py): mean costs, static levels and the full EST/LST pass of eqs. (6)-(10).

Unscheduled nodes (the DCP literature's convention, which FD-DPS inherits through FastT):
  ET of an unscheduled node     = its mean over the devices (HEFT's and DCP's choice; the minimum
                                  would make every estimate optimistic and the slack meaningless on
                                  heterogeneous devices)
  w of an edge with an unscheduled end = the mean of w(k, l) over ordered device pairs k != l, i.e.
                                  mean(alpha) + bytes * mean(1 / beta): Definition 4 is linear in the
                                  bytes, so this is the exact mean transfer. One device: 0.
Scheduled nodes use their own ET and the real link; consecutive nodes on one device are joined by a
zero-weight sequence edge, so with everything placed EST = `replay`'s start and DCPL = makespan.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.planners.fddps.problem import DagProblem, DagProblemError


def tolerance(scale: float) -> float:
    """EST = LST 'within a tolerance' (eq. (8)): relative to the schedule length, floats drift."""
    return 1e-9 * abs(scale) + 1e-15


def quantize(value: float, scale: float) -> int:
    """A priority with float noise removed (ties within `tolerance(scale)` compare equal, so the
    explicit tie-breaks decide, e.g. HEFT's two rank-80 nodes of its published example)."""
    return round(value / tolerance(scale))


@dataclass(frozen=True, eq=False)
class MeanCosts:
    et_mean: list[float]  # ET of an unscheduled node
    mean_alpha: float
    mean_inv_beta: float

    def transfer(self, nbytes: float) -> float:
        """w of an edge with an unscheduled end."""
        return self.mean_alpha + nbytes * self.mean_inv_beta


def mean_costs(problem: DagProblem) -> MeanCosts:
    d = problem.n_devices
    et_mean = problem.exec_s.mean(axis=1).tolist()
    if d == 1:
        return MeanCosts(et_mean, 0.0, 0.0)
    off = ~np.eye(d, dtype=bool)
    inv_beta = 1.0 / problem.link_bytes_per_s[off]
    return MeanCosts(et_mean, float(problem.link_alpha_s[off].mean()), float(inv_beta.mean()))


def bottom_levels(problem: DagProblem, mean: MeanCosts) -> tuple[list[float], list[float]]:
    """Static upward levels with mean costs: blevel(i) = ET(i) + tail(i), tail(i) = max over children
    of w(e) + blevel(c) (0 for an exit). HEFT's rank_u; DCPL - blevel is the LST of eq. (7) of any
    node whose descendants are all unscheduled."""
    children = problem.lists.children
    et_mean = mean.et_mean
    ma, mib = mean.mean_alpha, mean.mean_inv_beta
    n = problem.n_nodes
    blevel, tail = [0.0] * n, [0.0] * n
    for i in range(n - 1, -1, -1):  # reverse topological: every child has a larger index
        best = 0.0
        for c, nb in children[i]:
            v = (ma + nb * mib) + blevel[c]
            if v > best:
                best = v
        tail[i] = best
        blevel[i] = et_mean[i] + best
    return blevel, tail


@dataclass(frozen=True, eq=False)
class CriticalPathTimes:
    est: np.ndarray  # EST(o_i), eq. (6)
    lst: np.ndarray  # LST(o_i), eq. (7) in its standard form (see dps.py)
    dcpl: float  # eq. (10)
    critical: np.ndarray  # eq. (8)
    path: tuple[int, ...]  # one dynamic critical path, entry to exit


def critical_path_times(problem: DagProblem, device=None, order=None) -> CriticalPathTimes:
    """The full O(n + e) pass over the graph plus the device sequence edges of a partial schedule:
    device[i] = -1 marks o_i unscheduled, order[k] lists device k's scheduled nodes in run order.
    The schedulers keep these numbers incrementally; this is the reference they are tested against
    (and FastT's one static pass, with nothing scheduled)."""
    n = problem.n_nodes
    lists, mean = problem.lists, mean_costs(problem)
    dev = [-1] * n if device is None else [int(x) for x in np.asarray(device).tolist()]
    nxt, has_prev = [-1] * n, [False] * n
    for seq in order or ():
        for a, b in zip(seq, seq[1:], strict=False):
            nxt[a], has_prev[b] = b, True
    et = [lists.et[i][dev[i]] if dev[i] >= 0 else mean.et_mean[i] for i in range(n)]

    def weight(a: int, b: int, nb: float) -> float:
        ka, kb = dev[a], dev[b]
        if ka < 0 or kb < 0:
            return mean.transfer(nb)
        return 0.0 if ka == kb else lists.alpha[ka][kb] + nb / lists.beta[ka][kb]

    succ = [[(c, weight(i, c, nb)) for c, nb in lists.children[i]] + ([(nxt[i], 0.0)] if nxt[i] >= 0 else [])
            for i in range(n)]
    waiting = [len(lists.parents[i]) + has_prev[i] for i in range(n)]
    queue = [i for i in range(n) if waiting[i] == 0]
    topo = []
    est = [0.0] * n
    while queue:
        i = queue.pop()
        topo.append(i)
        fin = est[i] + et[i]
        for c, w in succ[i]:
            arrive = fin + w if w else fin
            if arrive > est[c]:
                est[c] = arrive
            waiting[c] -= 1
            if waiting[c] == 0:
                queue.append(c)
    if len(topo) < n:
        raise DagProblemError("order: the device orders deadlock with the edges")
    dcpl = max(est[i] + et[i] for i in range(n))
    lst = [0.0] * n
    for i in reversed(topo):
        latest = dcpl
        for c, w in succ[i]:
            v = lst[c] - w
            if v < latest:
                latest = v
        lst[i] = latest - et[i]
    tol = tolerance(dcpl)
    critical = [abs(lst[i] - est[i]) <= tol for i in range(n)]
    path = _trace_path(est, et, succ, critical, tol)
    return CriticalPathTimes(np.array(est), np.array(lst), dcpl, np.array(critical), path)


def _trace_path(est, et, succ, critical, tol) -> tuple[int, ...]:
    """Section 4.2's last step: follow critical nodes whose finish + w is exactly a critical
    successor's EST, from a critical entry node (EST = 0)."""
    starts = [i for i in range(len(est)) if critical[i] and est[i] <= tol]
    if not starts:
        return ()
    path = [starts[0]]
    while True:
        i = path[-1]
        step = next((c for c, w in succ[i] if critical[c] and abs(est[i] + et[i] + w - est[c]) <= tol), None)
        if step is None:
            return tuple(path)
        path.append(step)
