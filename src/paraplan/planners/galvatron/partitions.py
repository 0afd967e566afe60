"""Galvatron-BMW's partitions (../shared/papers/galvatron-bmw.md): which ones a search tries (the
even one, and Algorithm 2's memory-balanced p_m, time-balanced p_t and the workload-balance
adjustment from p_m: the planner option `bmw_partition`), Algorithm 2 itself (`adjust_partition`,
`Searcher.bmw`), and the batch search's quick memory probe over the even and memory-balanced
partitions (`fits`, `Searcher.fits`). Each takes a planners/galvatron/searcher.py `Searcher`.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from paraplan.costs.memory import micro_batches_in_flight
from paraplan.planners.galvatron.dp import INF, partition_min_max
from paraplan.planners.galvatron.space import even_partition

# Algorithm 2's partitions, the planner option `bmw_partition` (the ablation of BMW's own ideas,
# benchmarks/galvatron_bmw_ablation.py, docs/galvatron.md "BMW's own ideas against Base"): "+"-joined
# from even (the even partition's result: our deviation, BMW never worse than Base), memory (the
# memory-balanced p_m alone, no adjustment), time (the time-balanced p_t alone) and biobj (p_m and the
# workload-balance adjustment's queue from it: Algorithm 2). Table IV's rows are memory (1F1B+Mem),
# time (1F1B+Time) and biobj (1F1B+Bi-obj); the default keeps the even partition beside Algorithm 2.
BMW_PARTS = ("even", "memory", "time", "biobj")
BMW_PARTITION = "even+biobj"


def bmw_parts(value) -> frozenset[str]:
    """The partitions named by a `bmw_partition` value; FieldError on anything else."""
    from paraplan.planners.request import FieldError

    parts = frozenset(str(value).split("+"))
    if not parts or not parts <= set(BMW_PARTS) or "" in parts:
        raise FieldError("options.bmw_partition", f"expected '+'-joined names from {', '.join(BMW_PARTS)} "
                         f"(e.g. {BMW_PARTITION}), got {value!r}")
    return parts


def searched_parts(request) -> frozenset[str]:
    """The partitions BMW searches (the request's `bmw_partition`, default even+biobj)."""
    return bmw_parts(request.options.get("bmw_partition", BMW_PARTITION))


def fits(searcher, n_stages: int, n_micro: int, schedule: str) -> bool:
    """A quick probe for the batch search: does some assignment fit every stage of the even or
    of a memory-balanced partition? (The least whole memory of a stage is exact: for each
    backward budget b, b + the least forward memory of every layer among the strategies within b.)"""
    micro = searcher.request.batch / n_micro
    a = searcher.arrays(searcher.group(n_stages, 0), micro)
    allowed = a["allowed"]  # [layer, strategy]
    flights = [micro_batches_in_flight(schedule, n_stages, s, n_micro) for s in range(n_stages)]
    kept = a["saved_bytes"] + a["extra_forward"]
    back = a["recompute_bytes"] + a["extra_backward"]
    least = np.stack([np.where(allowed, a["states_bytes"] + k * kept + back, INF).min(axis=1) for k in flights])
    parts = searched_parts(searcher.request) if searcher.variant.bmw else frozenset({"even"})
    sizes = {even_partition(searcher.model.n_layers, n_stages)} if parts & {"even", "time"} else set()
    if parts & {"memory", "biobj"} and np.isfinite(least).all():  # BMW starts from a memory-balanced one
        sizes.add(partition_min_max(least, n_stages))
    if not sizes:  # nothing fits anywhere: the even partition stands for it
        sizes.add(even_partition(searcher.model.n_layers, n_stages))
    for part in sizes:
        bounds = np.concatenate(([0], np.cumsum(part))).astype(int)
        ok = True
        for s in range(n_stages):
            devices = searcher.group(n_stages, s)
            capacity = (min(searcher.cluster.device(d).memory_bytes for d in devices) - searcher.config.reserve_bytes)
            rows = slice(bounds[s], bounds[s + 1])
            fmem = np.where(allowed[rows], a["states_bytes"][rows] + flights[s] * kept[rows], INF)
            bmem = np.where(allowed[rows], back[rows], INF)
            need = min((b + np.where(bmem <= b, fmem, INF).min(axis=1).sum()
                        for b in np.unique(bmem[np.isfinite(bmem)])), default=INF)
            if need > capacity:
                ok = False
                break
        if ok:
            return True
    return False


def layer_profile(searcher, n_stages: int, n_micro: int, schedule: str, choice: tuple[int, ...]):
    """Per layer under `choice`: time of one micro-batch, and memory on each stage [stage, layer]."""
    micro = searcher.request.batch / n_micro
    a = searcher.arrays(searcher.group(n_stages, 0), micro)
    idx, r = np.array(choice), np.arange(len(choice))
    t = (a["forward_s"] + a["backward_s"])[r, idx]
    mem = np.stack([a["states_bytes"][r, idx] + micro_batches_in_flight(schedule, n_stages, s, n_micro)
                    * (a["saved_bytes"] + a["extra_forward"])[r, idx] for s in range(n_stages)])
    return t, mem, (a["recompute_bytes"] + a["extra_backward"])[r, idx]


def adjust_partition(searcher, n_stages: int, n_micro: int, schedule: str, start) -> list:
    """Algorithm 2's partition adjustment for one (P, m, schedule) from the even partition's result,
    with the partitions the request's `bmw_partition` names (all of Algorithm 2 and the even one
    by default); each result's `origin` says where its partition came from."""
    parts = searched_parts(searcher.request)
    strategies = searcher.arrays(searcher.group(n_stages, 0), searcher.request.batch / n_micro)["strategies"]
    choice = tuple(strategies.index(x) for st in start.plan.stages for x in st.strategies)
    t, mem, rec = layer_profile(searcher, n_stages, n_micro, schedule, choice)
    p_m = partition_min_max(mem, n_stages)  # memory-balanced (Strategy_Init: the even partition's strategies)
    p_t = partition_min_max(np.repeat(t[None, :], n_stages, axis=0), n_stages)
    capacity = min(d.spec.memory_bytes for d in searcher.cluster.devices) - searcher.config.reserve_bytes

    def stage_values(sizes):
        b = np.concatenate(([0], np.cumsum(sizes))).astype(int)
        times = np.array([t[b[s]:b[s + 1]].sum() for s in range(n_stages)])
        mems = np.array([mem[s, b[s]:b[s + 1]].sum() + rec[b[s]:b[s + 1]].max() for s in range(n_stages)])
        return times, mems

    even = tuple(st.layers.stop - st.layers.start for st in start.plan.stages)
    results = [start] if "even" in parts else []
    if "time" in parts:
        results.append(replace(searcher.evaluate(p_t, n_micro, schedule), origin="time"))
    queue = [p_m] if parts & {"memory", "biobj"} else []
    seen = {p_m} | ({even} if "even" in parts else set())
    for _ in range(4 * searcher.model.n_layers):
        if not queue:
            break
        sizes = queue.pop(0)
        result = searcher.evaluate(sizes, n_micro, schedule)
        results.append(replace(result, origin="memory" if sizes == p_m else "adjusted"))
        if not np.isfinite(result.estimate_s) or "biobj" not in parts:
            continue
        choice = tuple(strategies.index(x) for st in result.plan.stages for x in st.strategies)
        t, mem, rec = layer_profile(searcher, n_stages, n_micro, schedule, choice)
        times, _ = stage_values(sizes)
        # limit 3 under the strategies S the other limits use (validate(p', M, P, S)): p_t's largest
        # stage memory under Strategy_Init's strategies held the adjustment back wherever the
        # re-search spent the memory p_m freed (issue 31: T5-512/4-32 on 16 A100s at 8 GiB, batch
        # 128, 2 stages of 8 micro-batches: p_m [10, 25] 0.586 s -> [11, 24] 0.550 s by eq. (8))
        limit_t = stage_values(p_t)[1].max()
        slowest = int(np.argmax(times))
        for neighbour in (slowest - 1, slowest + 1):  # move the slowest stage's boundary layer over
            if not 0 <= neighbour < n_stages or sizes[slowest] <= 1:
                continue
            new = list(sizes)
            new[slowest] -= 1
            new[neighbour] += 1
            new = tuple(new)
            if new in seen:
                continue
            new_times, new_mems = stage_values(new)
            if new_times.max() <= times.max() and new_mems.max() <= capacity and new_mems.max() <= limit_t:
                seen.add(new)
                queue.append(new)
    return results
