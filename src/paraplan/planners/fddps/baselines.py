"""The DAG schedulers FD-DPS is compared with (its §5.1 baselines, plus HEFT as a textbook reference),
on the same `DagProblem`, memory ledger and timing (`replay`) as FD-DPS.

FastT-like (Yi et al., Middleware 2020), as FD-DPS §2.2/§5.1 describe it: "static operator priority
according to the critical path". One EST/LST pass with mean costs, computed up front and never
updated (critical_path.critical_path_times with nothing placed); schedulable nodes go in order of least
static slack LST - EST (ties: the longer remaining path, then index), each to the device giving its
earliest finish time with idle-slot insertion. FastT's own device rule is not spelled out in the
FD-DPS paper; earliest finish is the DCP/HEFT family's rule and what FastT's EST/LST machinery
supports. FastT's operator splitting is the caller's (the graph comes in split) and is not done here.

HEFT (Topcuoglu, Hariri and Wu, IEEE TPDS 2002): rank_u with mean ET and mean transfer (the same
bottom level as FD-DPS's LST uses), nodes by decreasing rank_u (ties: index), each to the device of
earliest finish time with insertion into idle slots.

MP-DPS-like (Zeng et al., CCF THPC 2022). The FD-DPS paper gives two sentences: it "reduces the
search space by merging nodes with computing power awareness" and "implements optimal scheduling by
predicting the path cost in DAG"; its abstract adds "predicting the optimal placement of critical
operator node on the path". Its own algorithm is not available here, so this is our reading:
  * merging: a node joins its parents' group when all its parents are in one group and the group
    stays under a work cap (total mean work / (devices x `groups_per_device`): a group is a small
    slice of what one device must do, which is where computing power enters) and a memory cap
    (the smallest capacity / `groups_per_device`). Visiting nodes in topological order and merging
    only into the unique parent group never creates a cycle between groups (a joining node's other
    edges go to nodes not yet visited). Chains collapse, as do fans that start in one group.
  * path prediction: PEFT's optimistic cost table (Arabnejad and Barbosa, IEEE TPDS 2014) on the
    group graph: OCT(g, v_k) = max over child groups h of min over v_l of OCT(h, v_l) + ET(h, v_l) +
    w(v_k, v_l), the length of the rest of the critical path if every later group lands on its
    best device. Groups go by decreasing mean OCT among the schedulable ones, each to the device
    minimising its finish time + OCT. A group runs contiguously on its device, members in index
    order, appended after the device's last node (no insertion).
"""

from __future__ import annotations

import heapq
import math
import time

import numpy as np

from paraplan.planners.fddps.critical_path import bottom_levels, critical_path_times, mean_costs, quantize
from paraplan.planners.fddps.list_scheduling import INF, ScheduleBuilder, check_links
from paraplan.planners.fddps.problem import DagProblem, DagSchedule


def _eft_list_schedule(problem: DagProblem, keys: list, insertion: bool = True,
                       links: str = "free") -> tuple[ScheduleBuilder, dict]:
    """Schedulable nodes by increasing `keys[i]`; each to the device of earliest finish (ties: earlier
    start, lower index) among those with memory room. links="ports": the finish includes the waits
    for the send and receive ports (ports.PortLedger; ours, the published algorithms have none)."""
    check_links(links)
    builder = ScheduleBuilder(problem, ports=links == "ports")
    et, parents, children = builder.lists.et, builder.lists.parents, builder.lists.children
    missing = [len(p) for p in parents]
    heap = [(keys[i], i) for i in range(problem.n_nodes) if missing[i] == 0]
    heapq.heapify(heap)
    d = problem.n_devices
    inserted = 0
    while heap:
        _, i = heapq.heappop(heap)
        est = builder.arrivals(i)
        slots = [builder.slot(i, k, est[k], insertion) for k in range(d)]
        fits = builder.exact_devices(i, builder.allowed(i, [k for k in range(d) if slots[k][2] >= 0]),  # free: all
                                     [slots[k][0] + et[i][k] for k in range(d)])
        if fits:
            k = min(fits, key=lambda j: (slots[j][0] + et[i][j], slots[j][0], j))
        else:
            k = builder.no_room(i, [s[2] for s in slots])
        inserted += slots[k][1] >= 0
        builder.commit(i, k, slots[k][0], slots[k][1])
        for c, _ in children[i]:
            missing[c] -= 1
            if missing[c] == 0:
                heapq.heappush(heap, (keys[c], c))
    return builder, {"inserted": inserted}


def schedule_heft(problem: DagProblem, *, insertion: bool = True, links: str = "free") -> DagSchedule:
    """HEFT; links="ports" books transfers on the devices' ports while choosing the earliest finish,
    the contention-aware list scheduling of Sinnen & Sousa 2005 (not the published HEFT)."""
    t0 = time.perf_counter()
    rank_u, _ = bottom_levels(problem, mean_costs(problem))
    scale = max(rank_u)
    # rank_u(parent) >= rank_u(child), so with index tie-breaks the ready heap pops exactly HEFT's list order
    keys = [(-quantize(r, scale), i) for i, r in enumerate(rank_u)]
    builder, stats = _eft_list_schedule(problem, keys, insertion, links)
    return builder.result(dict(stats, search_s=time.perf_counter() - t0))


def schedule_fastt(problem: DagProblem, *, links: str = "free") -> DagSchedule:
    t0 = time.perf_counter()
    static = critical_path_times(problem)  # computed once, never updated: FastT's static priority
    slack = (static.lst - static.est).tolist()
    blevel = (static.dcpl - static.lst).tolist()
    scale = static.dcpl
    keys = [(quantize(slack[i], scale), -quantize(blevel[i], scale), i) for i in range(problem.n_nodes)]
    builder, stats = _eft_list_schedule(problem, keys, links=links)
    return builder.result(dict(stats, search_s=time.perf_counter() - t0))


# --- MP-DPS-like ------------------------------------------------------------------------------------

def merge_nodes(problem: DagProblem, groups_per_device: int = 32) -> list[int]:
    """Group label per node (labels in topological order of the groups); see the module doc."""
    n, d = problem.n_nodes, problem.n_devices
    work = problem.exec_s.mean(axis=1).tolist()
    work_cap = sum(work) / (d * groups_per_device)
    capacity = float(problem.capacity_bytes.min())
    memory_cap = capacity / groups_per_device if math.isfinite(capacity) else INF
    weight = (problem.resident_bytes + problem.output_bytes).tolist()
    parents = problem.lists.parents
    group = [-1] * n
    group_work: list[float] = []
    group_bytes: list[float] = []
    for v in range(n):
        homes = {group[p] for p, _ in parents[v]}
        if len(homes) == 1:
            g = homes.pop()
            if group_work[g] + work[v] <= work_cap and group_bytes[g] + weight[v] <= memory_cap:
                group[v] = g
                group_work[g] += work[v]
                group_bytes[g] += weight[v]
                continue
        group[v] = len(group_work)
        group_work.append(work[v])
        group_bytes.append(weight[v])
    return group


def _optimistic_costs(problem: DagProblem, group_et: np.ndarray, group_children: list[dict[int, float]]) -> np.ndarray:
    """PEFT's OCT [groups, d] on the group graph (a child group reached by several edges: its largest
    tensor, transfers do not contend)."""
    n_groups, d = group_et.shape
    alpha = problem.link_alpha_s.copy()
    beta = problem.link_bytes_per_s
    off = ~np.eye(d, dtype=bool)
    oct_ = np.zeros((n_groups, d))
    for g in range(n_groups - 1, -1, -1):  # group labels are topological
        kids = group_children[g]
        if not kids:
            continue
        hs = np.fromiter(kids.keys(), dtype=np.int64, count=len(kids))
        nb = np.fromiter(kids.values(), dtype=np.float64, count=len(kids))
        w = np.where(off, alpha[None] + nb[:, None, None] / np.where(off, beta, 1.0)[None], 0.0)  # [h, k, l]
        ahead = (oct_[hs] + group_et[hs])[:, None, :] + w
        oct_[g] = ahead.min(axis=2).max(axis=0)
    return oct_


def schedule_mpdps(problem: DagProblem, *, groups_per_device: int = 32) -> DagSchedule:
    t0 = time.perf_counter()
    n, d = problem.n_nodes, problem.n_devices
    group = merge_nodes(problem, groups_per_device)
    n_groups = max(group) + 1
    members: list[list[int]] = [[] for _ in range(n_groups)]
    for v in range(n):
        members[group[v]].append(v)
    group_et = np.zeros((n_groups, d))
    np.add.at(group_et, np.asarray(group), problem.exec_s)
    group_children: list[dict[int, float]] = [{} for _ in range(n_groups)]
    group_missing = [0] * n_groups
    for a, b, nb in zip(problem.edge_src.tolist(), problem.edge_dst.tolist(), problem.edge_bytes.tolist(), strict=True):
        ga, gb = group[a], group[b]
        if ga != gb:
            if gb not in group_children[ga]:
                group_missing[gb] += 1
            group_children[ga][gb] = max(group_children[ga].get(gb, 0.0), nb)
    oct_ = _optimistic_costs(problem, group_et, group_children)
    rank = oct_.mean(axis=1).tolist()
    oct_rows = oct_.tolist()

    builder = ScheduleBuilder(problem)
    lists = builder.lists
    heap = [(-rank[g], g) for g in range(n_groups) if group_missing[g] == 0]
    heapq.heapify(heap)
    resident, output = builder.resident, builder.output
    while heap:
        _, g = heapq.heappop(heap)
        mine = members[g]
        best = None
        rooms = []
        allowed = set(range(d))
        for v in mine:  # runnable=true: members colocated with a node of an earlier group go to its device
            c = builder.colocate[v] if builder.colocate is not None else -1
            if c >= 0 and group[c] != g and builder.device[c] in allowed:
                allowed = {builder.device[c]}
        for k in range(d):
            if k not in allowed:
                rooms.append(-math.inf)
                continue
            times = _append_times(builder, lists, mine, k)
            room = builder.memory.headroom(k, times[0][0], sum(resident[v] for v in mine), sum(output[v] for v in mine))
            rooms.append(room)
            if room >= 0:
                score = (times[-1][1] + oct_rows[g][k], times[-1][1], k)  # PEFT's O_EFT
                if best is None or score < best[0]:
                    best = (score, k, times)
        if best is None:
            k = builder.no_room(mine[0], rooms)
            times = _append_times(builder, lists, mine, k)
        else:
            _, k, times = best
        for v, (s, _) in zip(mine, times, strict=True):
            builder.commit(v, k, s, -1)
        for h in group_children[g]:
            group_missing[h] -= 1
            if group_missing[h] == 0:
                heapq.heappush(heap, (-rank[h], h))
    stats = {"groups": n_groups, "search_s": time.perf_counter() - t0}
    return builder.result(stats)


def _append_times(builder: ScheduleBuilder, lists, members: list[int], k: int) -> list[tuple[float, float]]:
    """(start, finish) of a group's members run back to back at the end of device k, as `replay`
    would time them (members inside the group count as on v_k, not yet committed)."""
    device, finish, alpha, beta, et = builder.device, builder.finish, lists.alpha, lists.beta, lists.et
    local: dict[int, float] = {}
    free = builder.timelines[k].free_at
    out = []
    for v in members:
        s = free
        for p, nb in lists.parents[v]:
            if p in local:
                a = local[p]
            else:
                kp = device[p]
                a = finish[p] if kp == k else finish[p] + (alpha[kp][k] + nb / beta[kp][k])
            if a > s:
                s = a
        free = s + et[v][k]
        local[v] = free
        out.append((s, free))
    return out
