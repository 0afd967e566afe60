"""FD-DPS's scheduling core (Zeng et al., Mathematics 2022, §4.2-4.4: Definitions 8-12, eqs. (6)-(12),
Algorithms 1-3) on a `DagProblem`. Intra-operator splitting (Algorithm 3 lines 2-6) happens before:
the caller hands in the already split graph.

Algorithm 3's loop, as implemented:
  Node_Queue = the schedulable nodes (all parents placed), starting with the entry nodes;
  Sort_Node (Algorithm 1): a critical node (eq. (8): EST = LST within `tolerance`) if there is one,
    else the highest Score = 1 / (LST - EST + eps) (eq. (9));
  Find_Slot (Algorithm 2): the devices with memory room where o_i fits a slot by eq. (11), then
    (1) a parent's device, (2) eq. (12)'s device for the highest-priority child, (3) the earliest
    start; with no such device, (4) the device running the lowest-priority node;
  update the edge weights, EST and LST (line 27) and repeat.

Definitions, as the DCP literature (Kwok & Ahmad 1996, which FastT and FD-DPS follow) uses them:
  ET / w of unscheduled nodes and edges: their means (critical_path.py's module doc).
  EST(o_i), eq. (6): the longest path to o_i over the graph plus the sequence edges of the placed
    nodes; for a placed node it is its start time.
  LST(o_i), eq. (7): DCPL - blevel(o_i), blevel = the longest path from o_i's start to the end.
    The paper's eq. (7), min over successors of LST(o_j) - ET(o_j) - w, subtracts the successor's
    ET where the standard form subtracts o_i's own: read literally it is a latest finish time, which
    would make eq. (8) (EST = LST) false on every critical node with ET > 0 and contradict eq. (11),
    whose LST(o_i) + ET(o_i) is a latest finish. We use the standard form.
  DCPL, eq. (10): max over nodes of EST + ET; with every node placed it is the makespan.

Choices where the paper is ambiguous (each a deviation to keep in mind when comparing numbers):
  * Placed nodes never move. The paper's prose for Find_Slot: "the scheduling process cannot affect
    the execution of scheduled nodes on these devices"; so eq. (11)'s LST(o_m, v_k) of the node
    after an insertion slot is o_m's start (a pinned node's latest start), i.e. o_i must fit the
    idle gap between o_j and o_m. (DCP itself lets o_m slide up to its LST; that needs the LST of
    every placed node, whose exact upkeep costs a pass over all placed ancestors per placement.)
  * EST(o_i, v_k) in eq. (11) uses the real link from every placed parent (0 from one on v_k). The
    paper's EST' only removes the same-device parent's transfer; with all parents placed there is
    nothing left to estimate. Its LST' (LST minus that parent transfer) has no basis in eq. (7) and
    is not used: LST(o_i, v_k) = DCPL - ET(o_i, v_k) - tail(o_i), tail = the mean-cost longest path
    after o_i.
  * eq. (12) says argmax but its text says "minimises the execution time": argmin. The child o_c
    with the highest Score is the one maximising w(o_i, o_c) + blevel(o_c), the least slack through
    o_i (exact whenever o_i is o_c's latest parent; o_c's other parents are not placed yet).
  * Algorithm 2 as printed assigns every device in turn (its third branch is `else if 1`); we read
    its prose: the rules are a lexicographic preference (1) > (2) > (3). Rule (2) only breaks ties
    when (1) does not apply; rule (3) breaks the remaining ties (identical devices tie in (2)).
  * Rule (4), "the device that has the lowest priority node": the device whose last node in its
    order had the lowest Score (most slack) when it was placed; an empty device counts as lowest.
    This ignores when the device is free, which is clearly poor on a saturated cluster, so
    `fallback="earliest_finish"` (not the paper) picks the earliest finish instead.
  * Algorithm 1 takes the first critical node in queue order; we take the node with the largest
    EST + blevel (least slack), ties in queue order, which differs only among nodes whose slack is
    within the tolerance of 0.
  * Memory (eq. (4)'s M_v < C): a device is a candidate only if the node fits its memory ledger
    (device_state.MemoryLedger, an upper bound of the finished schedule's peak). If no device has room
    the schedule is marked infeasible, naming the node and its bytes, and the node goes to the
    device that comes closest, so the result is still a complete, replayable schedule.

Beyond the paper (ours, opt-in): `links="ports"` models the simulator's link contention while
scheduling. Find_Slot's EST(o_i, v_k) then waits for v_k's receive port and the parents' send ports
(ports.PortLedger, whose module doc has the port model and why), and devices whose bookings the
simulator would serve in another order are avoided; priorities, LST and DCPL keep the paper's
contention-free estimates of the unscheduled part. The default `links="free"` is the paper's model,
bit for bit.

Incremental update (Algorithm 3 line 27). Because placed nodes never move and a node is placed only
after all its parents: (a) a placed node's EST is final; (b) an unscheduled node's descendants are
all unscheduled, so its blevel (mean costs) never changes and its LST = DCPL - blevel changes only
through the scalar DCPL; (c) an unscheduled node's EST changes only when a parent is placed, and is
needed only once all its parents are, so it is computed then, once, from the parents' finishes
(lazy invalidation of the descendants: O(in-degree)). DCPL = max over placed nodes s of finish(s) +
max over unscheduled children c of w(s, c) + blevel(c), and over unscheduled entry nodes of their
blevel (every path is a placed prefix then an unscheduled suffix), kept in a lazy max-heap; placing
o_i changes only o_i's entry and its parents' (their unscheduled-children maximum, by a pointer
into the children sorted once by w + blevel). The priority key EST + blevel of a schedulable node is
fixed once it is schedulable, so Node_Queue is a heap. The LSTs of placed nodes (the ancestors
the paper's update would walk) are not kept: no rule reads them once placed nodes are pinned (rule
(4) reads the slack a node had when it was placed). Per placement: O(in-degree x d + deg log n) plus
the slot search (idle gaps after EST(o_i, v_k), usually few). `debug_check=True` runs the full pass (critical_path.critical_path_times) after every
placement and compares.
"""

from __future__ import annotations

import heapq
import time

from paraplan.planners.fddps.critical_path import (
    bottom_levels,
    critical_path_times,
    mean_costs,
    quantize,
    tolerance,
)
from paraplan.planners.fddps.list_scheduling import INF, ScheduleBuilder, check_links
from paraplan.planners.fddps.problem import DagProblem, DagSchedule

FALLBACKS = ("lowest_priority", "earliest_finish")
EPS_S = 1e-12  # eq. (9)'s eps: keeps Score finite on critical nodes


class FddpsState:
    """Algorithm 3's state between placements; `step` places one node."""

    def __init__(self, problem: DagProblem, fallback: str = "lowest_priority", links: str = "free"):
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {FALLBACKS}, got {fallback!r}")
        check_links(links)
        self.problem, self.fallback, self.links = problem, fallback, links
        self.builder = ScheduleBuilder(problem, ports=links == "ports")
        lists = problem.lists
        self.et, self.parents, self.children = lists.et, lists.parents, lists.children
        n = problem.n_nodes
        self.mean = mean_costs(problem)
        self.blevel, self.tail = bottom_levels(problem, self.mean)
        self.scale = max(self.blevel)  # the first DCPL: the unit of the priority's float-noise rounding
        ma, mib, bl = self.mean.mean_alpha, self.mean.mean_inv_beta, self.blevel
        # children by w + blevel, largest first: tail(i) = the first one still unscheduled
        self.by_tail = [sorted((((ma + nb * mib) + bl[c], c) for c, nb in kids), reverse=True) for kids in self.children]
        self.tail_ptr = [0] * n
        self.missing = [len(p) for p in self.parents]
        self.est = [0.0] * n  # EST(o_i) of a schedulable node, eq. (6), set when it becomes schedulable
        self.score_at = [0.0] * n  # Score, eq. (9), when placed (rule (4) reads it)
        self.frontier = [-INF] * n  # this node's candidate for DCPL
        self.dcpl_heap: list[tuple[float, int]] = []
        self.queue: list[tuple[int, int, int]] = []  # Node_Queue: (-(EST + blevel), arrival, node)
        self.arrival = 0
        for i in range(n):
            if self.missing[i] == 0:
                self.frontier[i] = bl[i]
                self.dcpl_heap.append((-bl[i], i))
                self._push(i)
        heapq.heapify(self.dcpl_heap)
        self.stats = {"critical_picks": 0, "rule1_parent": 0, "rule2_child": 0, "rule3_earliest": 0,
                      "rule4_fallback": 0, "no_room": 0, "inserted": 0}

    def _push(self, i: int) -> None:
        heapq.heappush(self.queue, (-quantize(self.est[i] + self.blevel[i], self.scale), self.arrival, i))
        self.arrival += 1

    def dcpl(self) -> float:
        """DCPL, eq. (10), of the current partial schedule."""
        heap, frontier = self.dcpl_heap, self.frontier
        while -heap[0][0] != frontier[heap[0][1]]:
            heapq.heappop(heap)
        return -heap[0][0]

    def _tailmax(self, s: int) -> float:
        entries, device = self.by_tail[s], self.builder.device
        ptr = self.tail_ptr[s]
        while ptr < len(entries) and device[entries[ptr][1]] >= 0:
            ptr += 1
        self.tail_ptr[s] = ptr
        return entries[ptr][0] if ptr < len(entries) else 0.0

    def _set_frontier(self, s: int, value: float) -> None:
        if value != self.frontier[s]:
            self.frontier[s] = value
            heapq.heappush(self.dcpl_heap, (-value, s))

    @property
    def done(self) -> bool:
        return not self.queue

    def step(self) -> int:
        """Sort_Node, Find_Slot, place, update; returns the node placed."""
        builder = self.builder
        _, _, i = heapq.heappop(self.queue)  # Sort_Node (Algorithm 1): least slack first
        dcpl = self.dcpl()
        tol = tolerance(dcpl)
        slack = dcpl - (self.est[i] + self.blevel[i])  # LST(o_i) - EST(o_i); Score = 1 / (slack + eps)
        if slack <= tol:  # eq. (8): a critical node
            self.stats["critical_picks"] += 1
        k, start, gap = self._find_slot(i, dcpl, tol)
        if gap >= 0:
            self.stats["inserted"] += 1
        self.score_at[i] = 1.0 / (max(slack, 0.0) + EPS_S)  # eq. (9)
        finish = builder.commit(i, k, start, gap)
        self._update(i, finish)
        return i

    def _find_slot(self, i: int, dcpl: float, tol: float) -> tuple[int, float, int]:
        """Algorithm 2 (see the module doc for how its rules are read)."""
        builder, et_i, d = self.builder, self.et[i], self.problem.n_devices
        est = builder.arrivals(i)
        slots = [builder.slot(i, k, est[k]) for k in range(d)]
        fits = builder.exact_devices(i, builder.allowed(i, [k for k in range(d) if slots[k][2] >= 0]),  # free: all
                                     [slots[k][0] + et_i[k] for k in range(d)])
        if not fits:
            self.stats["no_room"] += 1
            k = builder.no_room(i, [s[2] for s in slots])
            return k, slots[k][0], slots[k][1]
        tail_i = self.tail[i]
        # eq. (11): max{EST(o_i, v_k), EST(o_j) + ET(o_j)} + ET(o_i) <= min{LST(o_i, v_k) + ET(o_i), start(o_m)};
        # the slot search already keeps o_m's start, so what is left is start <= LST(o_i, v_k)
        candidates = [k for k in fits if slots[k][0] <= dcpl - (et_i[k] + tail_i) + tol]
        if candidates:
            parent_devices = {builder.device[p] for p, _ in self.parents[i]}
            pool = [k for k in candidates if k in parent_devices]
            if pool:
                self.stats["rule1_parent"] += 1
            else:
                pool = candidates
                entries = self.by_tail[i]
                if entries:  # eq. (12): o_c the highest-priority child, v_b minimising ET(o_c) + ET(o_i)
                    et_c = self.et[entries[0][1]]
                    both = {k: et_c[k] + et_i[k] for k in pool}
                    best = min(both.values())
                    narrowed = [k for k in pool if both[k] <= best + tolerance(best)]
                    if len(narrowed) < len(pool):
                        self.stats["rule2_child"] += 1
                    pool = narrowed
                if len(pool) > 1:
                    self.stats["rule3_earliest"] += 1
            k = min(pool, key=lambda j: (slots[j][0], slots[j][0] + et_i[j], j))  # rule (3)
        else:
            self.stats["rule4_fallback"] += 1
            if self.fallback == "lowest_priority":  # rule (4): the device whose last node has the lowest Score
                timelines = builder.timelines

                def last_score(j: int) -> float:  # an empty device runs nothing: lowest of all
                    return self.score_at[timelines[j].nodes[-1]] if timelines[j].nodes else 0.0

                k = min(fits, key=lambda j: (last_score(j), slots[j][0], j))
            else:
                k = min(fits, key=lambda j: (slots[j][0] + et_i[j], j))
        return k, slots[k][0], slots[k][1]

    def _update(self, i: int, finish: float) -> None:
        """Line 27: edge weights (a placed pair uses its real link), EST of the children that became
        schedulable, DCPL's heap entries of o_i and its parents."""
        builder = self.builder
        ma, mib = self.mean.mean_alpha, self.mean.mean_inv_beta
        for c, _ in self.children[i]:
            self.missing[c] -= 1
            if self.missing[c] == 0:
                t = 0.0
                for p, nb in self.parents[c]:  # w with an unscheduled end: the mean transfer
                    a = builder.finish[p] + (ma + nb * mib)
                    if a > t:
                        t = a
                self.est[c] = t
                self._push(c)
        self._set_frontier(i, finish + self._tailmax(i))
        for p, _ in self.parents[i]:
            self._set_frontier(p, builder.finish[p] + self._tailmax(p))

    # --- the reference check ----------------------------------------------------------------------
    def check_against_full_pass(self) -> None:
        """Compare the incremental state with `critical_path_times` of the partial schedule: EST of
        every node (placed: exact; unscheduled: the lazily derived values), LST of every unscheduled
        node, DCPL, and the critical flags of the schedulable ones."""
        builder, n = self.builder, self.problem.n_nodes
        full = critical_path_times(self.problem, builder.device, [tl.nodes for tl in builder.timelines])
        dcpl = self.dcpl()
        tol = 4 * tolerance(dcpl)
        _expect(abs(full.dcpl - dcpl) <= tol, f"DCPL {dcpl} != full pass {full.dcpl}")
        est = self.lazy_est()
        schedulable = {entry[2] for entry in self.queue}
        for u in range(n):
            if builder.device[u] >= 0:
                _expect(full.est[u] == builder.start[u], f"EST of placed node {u}: {builder.start[u]} != {full.est[u]}")
                continue
            _expect(abs(full.est[u] - est[u]) <= tol, f"EST of node {u}: {est[u]} != {full.est[u]}")
            lst = dcpl - self.blevel[u]
            _expect(abs(full.lst[u] - lst) <= tol, f"LST of node {u}: {lst} != {full.lst[u]}")
            if u in schedulable:
                _expect(abs(full.est[u] - self.est[u]) <= tol, f"EST of schedulable node {u}")

    def lazy_est(self) -> list[float]:
        """EST of every node: placed ones their start, schedulable ones the stored value, the rest
        derived on demand from their parents (never needed by the algorithm itself)."""
        builder, et_mean, mean = self.builder, self.mean.et_mean, self.mean
        est = list(self.est)
        for u in range(self.problem.n_nodes):
            if builder.device[u] >= 0:
                est[u] = builder.start[u]
            elif self.missing[u] > 0:
                t = 0.0
                for p, nb in self.parents[u]:
                    fin = builder.finish[p] if builder.device[p] >= 0 else est[p] + et_mean[p]
                    t = max(t, fin + mean.transfer(nb))
                est[u] = t
        return est


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(f"FD-DPS incremental state disagrees with the full pass: {message}")


def schedule_fddps(problem: DagProblem, *, fallback: str = "lowest_priority", debug_check: bool = False,
                   links: str = "free") -> DagSchedule:
    """FD-DPS (Algorithm 3) on `problem`; `fallback="earliest_finish"` replaces rule (4) (not the paper).

    `links="ports"` (ours, not the paper's): transfers contend for each device's one send and one
    receive port, as in the simulator; EST(o_i, v_k) of Find_Slot (eq. (11) and rules (1)-(4)) then
    includes the waits for the ports (ports.PortLedger). Everything else (priorities, LST, DCPL)
    keeps the paper's contention-free estimates of the unscheduled part. `debug_check` compares with
    the contention-free full pass, so it needs links="free"."""
    check_links(links)
    if debug_check and links != "free":
        raise ValueError("debug_check compares against the contention-free full pass: it needs links='free'")
    t0 = time.perf_counter()
    state = FddpsState(problem, fallback, links)
    while not state.done:
        state.step()
        if debug_check:
            state.check_against_full_pass()
    stats = dict(state.stats, search_s=time.perf_counter() - t0, fallback=fallback)
    return state.builder.result(stats)
