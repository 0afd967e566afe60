"""A fallback ladder (issue 53 item 2): the best plan for the cluster and for the cluster less 1, 2,
... F nodes (less devices on a one-node cluster), each for the same global batch and within memory,
so that a run that loses machines switches to a plan made for what is left instead of being
re-planned by hand (Oobleck's pipeline templates for N, N-1, ... nodes are the same idea).

Which nodes a rung drops: the ones named, then the slowest (a cluster of several kinds numbers its
nodes fastest first: hardware/cluster.py canonical_node_order, so the last nodes are the slowest).
The planners keep the same global batch: with fewer replicas they choose more micro-batches (or
gradient accumulation) themselves. The rungs share the model's measurement and its cost functions
(only the cluster changes) and split the comparison's time limit between them, so a ladder of F
fallbacks takes the time of one comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.errors import FieldError
from paraplan.hardware.cluster import Cluster
from paraplan.planners.request import PlanRequest
from paraplan.plans.ladder_file import LADDER_FORMAT, LADDER_VERSION


@dataclass(frozen=True)
class Rung:
    dropped: tuple[str, ...]  # the nodes (or "device N") this rung plans without; () for the whole cluster
    cluster: Cluster
    comparison: object  # planners/auto.py: Comparison
    costs: object = None  # the rung's CostModel (its cluster's)


def rung_clusters(cluster: Cluster, fallbacks: int, drop: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Cluster]]:
    """The cluster less 1..`fallbacks` nodes (`drop`'s first, then the slowest), or less 1..`fallbacks`
    devices (the last) on a one-node cluster: (what was dropped, the cluster left) per rung."""
    if isinstance(fallbacks, bool) or not isinstance(fallbacks, int) or fallbacks < 1:
        raise FieldError("fallbacks", f"a whole number of machines to plan without, at least 1; got {fallbacks!r}")
    names = [n.name for n in cluster.nodes]
    if len(names) > 1:
        unknown = [d for d in drop if d not in names]
        if unknown:
            raise FieldError("fallbacks", f"no node {unknown[0]!r} in {cluster.name} (its nodes: {', '.join(names)})")
        if fallbacks >= len(names):
            raise FieldError("fallbacks", f"{cluster.name} has {len(names)} nodes: at most {len(names) - 1} "
                                          f"fallbacks, got {fallbacks}")
        order = list(dict.fromkeys([*drop, *reversed(names)]))
        return [(tuple(order[:k]), cluster.without_nodes(order[:k])) for k in range(1, fallbacks + 1)]
    if drop:
        raise FieldError("fallbacks", f"{cluster.name} is one node: a rung drops its last devices, not named nodes")
    if fallbacks >= cluster.n_devices:
        raise FieldError("fallbacks", f"{cluster.name} has {cluster.n_devices} devices on one node: at most "
                                      f"{cluster.n_devices - 1} fallbacks, got {fallbacks}")
    return [(tuple(f"device {d}" for d in range(cluster.n_devices - k, cluster.n_devices)),
             cluster.without_last_devices(k)) for k in range(1, fallbacks + 1)]


def fallback_ladder(request: PlanRequest, cluster: Cluster, fallbacks: int, compare, time_limit_s: float = 60.0,
                    drop: tuple[str, ...] = (), **kwargs) -> list[Rung]:
    """Every rung's comparison (`compare`: planners/auto.py's, which this shared module may not
    import), the whole cluster's first, each with its share of `time_limit_s`. `cluster` is the
    request's cluster as loaded (its memory budget and headroom are the request's, applied again to
    each rung's cluster)."""
    rungs = [((), cluster), *rung_clusters(cluster, fallbacks, drop)]
    share = time_limit_s / len(rungs)
    out = []
    for dropped, left in rungs:
        here = request if not dropped else replace(request, costs=replace(request.costs, cluster=left),
                                                   cluster_name=left.name)
        out.append(Rung(dropped, left, compare(here, time_limit_s=share, **kwargs), here.costs))
    return out


def rung_goodput(rung: Rung, node_mtbf_h: float, switch=None):
    """The rung's best plan's goodput (costs/goodput.py) on the rung's cluster, its restart `switch`'s
    (rung_switch: priced once by the caller); None where nothing fits or the switch is not priced."""
    from paraplan.costs.goodput import plan_goodput

    if switch is None or not rung.comparison.best:
        return None
    best = rung.comparison.row(rung.comparison.best)
    return plan_goodput(best.plan, best.throughput, best.iteration_s, rung.costs, node_mtbf_h, switch.restart_s)


def ladder_document(rungs: list[Rung], model: str, global_batch: int, plan_to_dict, node_mtbf_h: float) -> dict:
    """The ladder as a versioned JSON document: per rung what it drops, its nodes and the best plan
    that fits with its prediction (None where nothing fits), what switching to it costs and its
    goodput at `node_mtbf_h`; the ladder's expected useful throughput (multi-node clusters)."""
    from paraplan.costs.goodput import ladder_goodput

    out, goodputs = [], []
    saved_under = None  # the plan the run was under when it lost a node: the rung before's (rung 0: its own)
    for k, rung in enumerate(rungs):
        result = rung.comparison
        best = result.row(result.best) if result.best else None
        priced = rung_switch(rung, saved_under) if best is not None and rung.costs is not None else None  # None: unpriced
        saved_under = best.plan if best is not None else saved_under
        g = rung_goodput(rung, node_mtbf_h, priced)
        goodputs.append(g)
        switch = priced if k else None  # rung 0 is where the run starts: no switch into it
        out.append({"dropped": list(rung.dropped), "cluster": rung.cluster.name, "devices": rung.cluster.n_devices,
                    "nodes": [n.name for n in rung.cluster.nodes],
                    "planner": result.best, "iteration_s": best.iteration_s if best else None,
                    "throughput_samples_per_s": best.throughput if best else None,
                    "switch": None if switch is None else {
                        "most_read_bytes": max(switch.read_bytes.values()), "total_read_bytes": sum(switch.read_bytes.values()),
                        "reload_s": switch.reload_s, "warmup_s": switch.warmup_s, "restart_s": switch.restart_s,
                        "storage": switch.storage_source},
                    "goodput": None if g is None else {
                        "samples_per_s": g.goodput, "useful": g.useful, "checkpoint_s": g.checkpoint_s,
                        "interval_s": g.interval_s, "job_mtbf_s": g.job_mtbf_s},
                    "plan": plan_to_dict(best.plan) if best else None})
    nodes = len(rungs[0].cluster.nodes)
    whole = None if nodes < 2 or any(g is None for g in goodputs) else ladder_goodput(goodputs, nodes, node_mtbf_h)
    return {"format": LADDER_FORMAT, "version": LADDER_VERSION, "model": model, "global_batch": global_batch,
            "node_mtbf_h": node_mtbf_h, "ladder_goodput_samples_per_s": whole, "rungs": out}


def rung_switch(rung: Rung, saved_under=None):
    """What moving to this rung's best plan from the last checkpoint, written under `saved_under`
    (the rung before's plan; None: this one's), costs (costs/restart.py); None for an operator
    placement (its runtime writes no checkpoints: runtime/dag/dag_runtime.py)."""
    from paraplan.costs.restart import switch_cost
    from paraplan.plans.kinds import PlanKind

    best = rung.comparison.row(rung.comparison.best)
    if best.plan.kind is PlanKind.OPERATORS:
        return None
    if saved_under is not None and saved_under.kind is PlanKind.OPERATORS:
        saved_under = None  # an operator placement's run writes no checkpoint: counted as held
    return switch_cost(best.plan, rung.costs, best.iteration_s, saved_under)
