"""FD-DPS (../shared/papers/fd-dps.md) and the operator-placement baselines it is compared with,
as planners: `fddps`, `fddps-nosplit` (the paper's D-DPS without intra-operator splitting),
`fastt`, `heft`, `mpdps`. Data parallelism is the `dp` planner (planners/galvatron/planner.py): one name,
one meaning.

Each planner reads the model's operator graph (`request.costs.operators`, models/op_trace.py),
splits compute-heavy operators along the batch for `fddps` (§4.1, models/op_split.py), builds
the graph search space of Definition 7 (`dag_problem`: ET per operator and device from
costs/op_costs.py, Definition 4's alpha-beta links, memory per costs/op_memory.py), schedules it
(planners/fddps/dps.py, planners/fddps/baselines.py) and returns a 'dag' Plan: per device the
operators it runs, in order. The plan's prediction is the simulator's (simulator/dag.py), which
with link contention off equals the schedule's own critical-path length (eq. (10)).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from paraplan.costs.op_costs import link_matrices, op_seconds_per_device
from paraplan.costs.op_memory import least_held_bytes, resident_bytes
from paraplan.models.op_split import PART, split_candidates, split_degree, split_operators
from paraplan.models.opspec import OpGraph
from paraplan.planners.fddps.baselines import schedule_fastt, schedule_heft, schedule_mpdps
from paraplan.planners.fddps.dps import FALLBACKS, schedule_fddps
from paraplan.planners.fddps.list_scheduling import LINKS
from paraplan.planners.fddps.problem import DagProblem, DagSchedule
from paraplan.planners.request import FieldError, Judge, OptionSpec, PlanRequest, at_least, one_of
from paraplan.planners.table import register
from paraplan.plans.plan import OperatorPlacement, Plan, SearchInfo

# The most devices an operator placement is searched on when the request does not name a count
# (issue 31, item 5). Every list-scheduling step tries each ready operator on each device: a
# Llama-2-70B-like graph (11,784 operators) took HEFT 83 s on 1,024 devices and would take ~5 s on
# 64. FD-DPS's own evaluation places on 8 devices; 64 (eight 8-GPU nodes) is far beyond where one
# placement of single operators helps (one copy of each operator, no data parallel replicas).
MAX_PLACEMENT_DEVICES = 64


def search_graph(request: PlanRequest, split: bool, runnable: bool = True) -> OpGraph:
    graph = request.costs.operators
    if graph is None:
        raise FieldError("operators", "this planner places operators: it needs the model's operator graph "
                                      "(CostModel.operators, built by models/op_trace.py)")
    if split:
        degree = request.n_stages or request.n_devices
        if not runnable:
            return split_operators(graph, degree, batch=request.batch)
        # runnable: a forward and its backward are split together, in the same parts (autograd
        # runs part k's backward where part k's forward ran): the rule's choice closed over the pairs
        d = split_degree(degree, request.batch)
        chosen = {graph.nodes[i].name for i in split_candidates(graph, request.batch)} if d >= 2 else set()
        pairs = [(n.name, n.forward_of) for n in graph.nodes if n.forward_of and n.splittable == "batch"]
        for bwd, fwd in pairs:
            if bwd in chosen or fwd in chosen:
                chosen |= {bwd, fwd}
        graph = split_operators(graph, dict.fromkeys(sorted(chosen), d)) if chosen else graph
    return graph


def colocation(graph: OpGraph) -> np.ndarray:
    """runnable=true: per node, the node whose device it must share (-1: free). A backward node goes
    with the forward op whose autograd Node it is (part k with part k of a split); a backward node
    of no forward op (a view's backward: no kernel) goes with its first backward parent, where the
    runtime replays the view; the gathers stay free."""
    index = graph.index()
    out = np.full(graph.n_nodes, -1, dtype=np.int64)
    first_parent = {}
    for e in graph.edges:
        if graph.nodes[e.src].phase == "backward":
            first_parent.setdefault(e.dst, e.src)
    for i, n in enumerate(graph.nodes):
        if n.phase != "backward" or n.op == "gather":
            continue
        if n.forward_of:
            head, sep, part = n.name.rpartition(PART)
            target = f"{n.forward_of}{PART}{part}" if sep and part.isdigit() else n.forward_of
            out[i] = index.get(target, index.get(n.forward_of, -1))
        elif i in first_parent:
            out[i] = first_parent[i]
    return out


def dag_problem(request: PlanRequest, graph: OpGraph, runnable: bool = True) -> DagProblem:
    """Definition 7's graph search space T(O', E', V', W) at the request's batch, on the first
    `request.n_stages` devices (the workers asked for; all of them by default). `runnable`: with
    the colocation of `colocation` and a zero-byte edge forward -> backward where there is none,
    so the forward is always placed first (autograd runs a backward after its forward anyway)."""
    cm, batch = request.costs, request.batch
    k = request.n_stages or request.n_devices
    alpha, beta = link_matrices(cm.cluster)
    params = np.array([n.param_bytes for n in graph.nodes], dtype=float)
    backward = np.array([n.phase == "backward" for n in graph.nodes])
    capacity = np.array([slot.spec.memory_bytes for slot in cm.cluster.devices[:k]], dtype=float)
    src = [e.src for e in graph.edges]
    dst = [e.dst for e in graph.edges]
    nbytes = [e.nbytes.at(batch) for e in graph.edges]
    colocate = None
    if runnable:
        colocate = colocation(graph)
        present = set(zip(src, dst, strict=True))
        for i, j in enumerate(colocate.tolist()):
            if j >= 0 and (j, i) not in present:
                src.append(j)
                dst.append(i)
                nbytes.append(0.0)
    return DagProblem(
        exec_s=op_seconds_per_device(graph, cm.cluster, batch, cm.operator_profile)[:, :k],
        edge_src=np.array(src, dtype=np.int64),
        edge_dst=np.array(dst, dtype=np.int64),
        edge_bytes=np.array(nbytes, dtype=float),
        link_alpha_s=alpha[:k, :k], link_bytes_per_s=beta[:k, :k],
        resident_bytes=resident_bytes(params, backward),
        output_bytes=np.array([n.output_bytes.at(batch) for n in graph.nodes], dtype=float),
        # the fixed reserve (costs/memory_config.py) is the simulator's too
        capacity_bytes=np.maximum(capacity - cm.memory.reserve_bytes, 1.0),
        names=tuple(n.name for n in graph.nodes), colocate=colocate)


def placement_plan(request: PlanRequest, graph: OpGraph, schedule: DagSchedule, name: str, seconds: float,
                   options: tuple = ()) -> Plan:
    placements = tuple(OperatorPlacement(d, tuple(graph.nodes[i].name for i in order))
                       for d, order in enumerate(schedule.order) if order)
    stats = tuple((k, float(v)) for k, v in schedule.stats.items() if isinstance(v, (int, float)) and k != "search_s")
    return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.n_layers,
                global_batch=request.batch, n_micro=1, schedule="dag", grad_sync="none", operators=placements,
                search=SearchInfo(planner=name, search_s=seconds,
                                  options=tuple(sorted((("costs", request.costs.source), ("operators", graph.n_nodes),
                                                        ("schedule_length_s", schedule.makespan_s)) + options + stats)),
                                  note="" if schedule.feasible else (schedule.reason or "")))


def _plan_with(name: str, scheduler, split: bool):
    def planner(request: PlanRequest, options: dict, judge: Judge) -> Plan:
        t0 = time.perf_counter()
        if request.n_micro not in (None, 1):
            raise FieldError("micro_batches", f"{name} places one iteration's operators; it has no micro-batches")
        runnable = bool(options.get("runnable", True))
        bounded = ""
        if request.n_stages is None and request.n_devices > MAX_PLACEMENT_DEVICES:
            bounded = (f"{name} places operators on {MAX_PLACEMENT_DEVICES} of the {request.n_devices} devices "
                       f"(its bound: list scheduling costs operators x devices per step)")
            request = replace(request, n_stages=MAX_PLACEMENT_DEVICES)
        graph = search_graph(request, split, runnable)
        schedule = scheduler(dag_problem(request, graph, runnable), options)
        plan = placement_plan(request, graph, schedule, name, time.perf_counter() - t0,
                              tuple((k, v) for k, v in sorted(options.items())))
        if bounded:
            plan = replace(plan, search=replace(plan.search, note="; ".join(x for x in (bounded, plan.search.note) if x)))
        prediction = judge(plan)
        if not schedule.feasible:
            prediction = replace(prediction, feasible=False,
                                 reason=f"{name} finds no placement that fits: {schedule.reason}")
        return replace(plan, prediction=prediction)

    return planner


# links: "free" is the paper's model (transfers never wait for each other); "ports" (ours, not the
# paper's) models the simulator's one send and one receive port per device while scheduling
# (ports.PortLedger), so the schedule's own length is what the contended simulator measures
# whenever no transfer was booked out of its first-come-first-served order (search option
# port_inversions = 0), and close to it otherwise.
def _boolean(name: str):
    def check(value):
        if not isinstance(value, bool):
            raise FieldError(f"options.{name}", f"must be true or false, got {value!r}")
    return check


# runnable (ours; the paper places every node freely): PyTorch's autograd runs an operator's
# backward where its forward ran, so a plan meant for `paraplan train` (runtime/dag/dag_runtime.py)
# keeps each backward node on its forward op's device; false: the paper's unconstrained placement,
# for simulation studies (benchmarks/runtime_dag.py measures what the constraint costs)
_RUNNABLE = {"runnable": OptionSpec(True, "keep every backward operator on its forward operator's device, as "
                                          "PyTorch's autograd runs it (false: the paper's free placement)",
                                    _boolean("runnable"))}


def _links(default: str) -> dict:
    return {**_RUNNABLE, "links": OptionSpec(default, "link model while scheduling: free (the paper: transfers never wait) | "
                                         "ports (one send and one receive port per device, as the simulator)",
                                one_of("links", LINKS))}


def _fddps_options(links: str, fallback: str = "lowest_priority") -> dict:
    return {**_links(links),
            "fallback": OptionSpec(fallback, "Find_Slot's rule (4) when no device meets the LST: "
                                                      "lowest_priority (the paper) | earliest_finish (not the paper)",
                                   one_of("fallback", FALLBACKS))}


_FDDPS_OPTIONS = _fddps_options("free")
_MPDPS_OPTIONS = {**_RUNNABLE, "groups_per_device": OptionSpec(32, "MP-DPS node merging: groups per device",
                                                  at_least("groups_per_device", 1))}
# --planner auto starts these searches late, after the Galvatron family and GroPipe (planners/table.py: slow)
_SLOW = {"fddps": 7, "fddps-nosplit": 8, "mpdps": 9, "fastt": 10, "heft": 11, "fddps-ports": 14}
# Seconds per (operator, device) pair each placement takes at the least, measured on this machine
# (2 cores; a 1,152-operator Llama-like graph on 8 to 64 H100s, 2026-11-28): FD-DPS weighs every
# device for every operator at 4.9 to 19.7 us a pair, HEFT's list scheduling at 1.1 to 3.4 us; the
# fastest of each is the rate its reach is judged by (`_reach`: a placement predicted to take longer
# than the comparison's time limit even at that rate does not start)
_PAIR_S = {"fddps": 4.9e-6, "fddps-nosplit": 4.9e-6, "fddps-ports": 4.9e-6, "mpdps": 4.9e-6, "fastt": 1.1e-6,
           "heft": 1.1e-6}


def _cannot_fit(request, graph: OpGraph, devices: int) -> str | None:
    """One line when no placement of the graph on its first `devices` devices can fit: the states
    and the forward outputs every placement holds at once (costs/op_memory.py `least_held_bytes`,
    a lower bound on the devices' peaks summed) exceed their memory together (issue 51 item 2: "a
    method that cannot fit the model is skipped before it starts"). Llama 3 70B at batch 512 needs
    thousands of TiB where 64 H100s have 5."""
    cm = request.costs
    need = least_held_bytes(graph, request.batch) + cm.memory.reserve_bytes
    have = sum(slot.spec.memory_bytes for slot in cm.cluster.devices[:devices])
    if need <= have:
        return None
    return (f"cannot fit: an operator placement runs the whole batch of {request.batch} through the forward "
            f"before the backward, so its {devices:,} devices would hold at least {_tib(need)} at once "
            f"(parameters' states and the activations the backward reads) where they have {_tib(have)}; "
            f"the layer planners plan it")


def _tib(nbytes: float) -> str:
    return f"{nbytes / 2**40:,.1f} TiB" if nbytes >= 2**40 else f"{nbytes / 2**30:,.1f} GiB"


def _reach(name: str):
    """A placement of every operator over the devices it weighs (the methods' own setting: FD-DPS's
    paper places a few hundred operators on 8 GPUs; MAX_PLACEMENT_DEVICES at most) reaches a request
    while operators x devices x its rate per pair fits in the comparison's time limit (a Llama-2-70B-
    like graph of 11,784 operators on 64 devices: 3.7 s); beyond that the layer planners plan it, and
    the comparison says so before the placement starts."""

    def reach(request, time_limit_s: float) -> str | None:
        graph = request.costs.operators
        if graph is None:
            return None
        devices = request.n_stages or min(request.n_devices, MAX_PLACEMENT_DEVICES)
        too_big = _cannot_fit(request, graph, devices)
        if too_big:
            return too_big
        pairs = graph.n_nodes * devices
        predicted = pairs * _PAIR_S[name]
        if predicted <= time_limit_s:
            return None
        return (f"out of an operator placement's reach: {graph.n_nodes:,} operators x {devices:,} devices "
                f"= {pairs:,} pairs, at least {predicted:.0f} s at its fastest measured {_PAIR_S[name] * 1e6:.1f} us "
                f"a pair, past the comparison's {time_limit_s:.0f} s; the layer planners plan it")

    return reach

for _name, _summary, _scheduler, _split, _options in (
    ("fddps", "FD-DPS: operator placement by dynamic critical paths, compute-heavy operators split along the batch",
     lambda p, o: schedule_fddps(p, links=o.get("links", "free"), fallback=o.get("fallback", "lowest_priority")),
     True, _FDDPS_OPTIONS),
    ("fddps-nosplit", "FD-DPS without intra-operator splitting (the paper's D-DPS)",
     lambda p, o: schedule_fddps(p, links=o.get("links", "free"), fallback=o.get("fallback", "lowest_priority")),
     False, _FDDPS_OPTIONS),
    # ours: ports while scheduling, and the earliest-finish fallback, which with ports beats the
    # paper's fddps on every model measured (benchmarks/fddps_contention.py); the paper's rule (4)
    # ignores when a device is free, and with ports far more nodes reach it
    ("fddps-ports", "FD-DPS with link contention modelled and an earliest-finish fallback (ours, not the paper's)",
     lambda p, o: schedule_fddps(p, links=o.get("links", "ports"), fallback=o.get("fallback", "earliest_finish")),
     True, _fddps_options("ports", "earliest_finish")),
    ("fastt", "FastT-like: static critical-path list scheduling of operators",
     lambda p, o: schedule_fastt(p, links=o.get("links", "free")), False, _links("free")),
    ("heft", "HEFT: upward-rank list scheduling, earliest finish time with insertion",
     lambda p, o: schedule_heft(p, links=o.get("links", "free")), False, _links("free")),
    ("mpdps", "MP-DPS-like: node merging and path prediction", lambda p, o: schedule_mpdps(
        p, groups_per_device=o.get("groups_per_device", 32)), False, _MPDPS_OPTIONS),
):
    register(_name, _summary, schedules=("dag",), options=_options, needs_operators=True, slow=_SLOW[_name],
             reach=_reach(_name))(
        _plan_with(_name, _scheduler, _split))
