"""PipeDream's partitioning algorithm with replicated stages (Narayanan et al., SOSP 2019, §3.1):
contiguous stages, each over its own number of devices (plans/stage_widths.py), chosen by a dynamic
program over layers and devices. `pipedream-dp` (planners/baselines/split.py) is the same program
restricted to one device a stage.

The paper's program: A(j, m), the time of the slowest stage when layers 1..j run on m machines,

    A(j, m) = min( T(1 -> j, m),  min_{i < j} min_{m' < m} max( A(i, m - m'), 2 C_i, T(i+1 -> j, m') ) ),
    T(i -> j, m) = (1/m) max( sum_l T_l, sum_l W_l^m ),

T_l a layer's forward + backward, W_l^m its weights' synchronisation over m replicas, C_i the
activation of layer i sent on. The plan is A(N, M)'s.

Where this differs, and why:
- A stage of m devices splits each micro-batch m ways (DAPPLE's replicated stage, what paraplan's
  plans and runtime do), where PipeDream sends whole mini-batches round robin: its time is each
  device's at B/m samples from the cost model's time functions (whose fixed costs do not shrink
  with m), not the whole batch's / m, and C_i is the rows one device of the receiving stage takes.
- The weights are synchronised once an iteration after a flush (1F1B as PipeDream-Flush runs it,
  not PipeDream's asynchronous weight stashing): W is the stage's ring all-reduce over its devices
  divided by the n_micro micro-batches it is spread over. The simulator prices the sync as run.
- Devices of several kinds (PipeDream's are alike): the devices are numbered fastest node first
  (hardware/cluster.py canonical_node_order) and a stage's devices are a contiguous range of them;
  a stage's time is its slowest kind's (every device takes the same rows).
- Beyond `UNIT_ABOVE` devices the program counts devices in whole nodes (PipeDream's hierarchical
  form, §3.1: first within a server, then across servers), so that 1,024 devices are 128 units.
- Every micro-batch count that divides the batch is tried, and besides A(N, M)'s plan the one using
  the fewest devices at the least A(N, m) (a slow kind that only adds a boundary is left out, and
  the plan says which devices idle); each also with a stage that spans kinds sharing its micro-batches
  by its devices' speeds (`speed_shares`, issue 52 item 3); all are judged by the simulator: the
  fastest that fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from paraplan.planners.fit import misfit, overflow
from paraplan.planners.request import FieldError, Judge, PlanRequest, divisors
from paraplan.planners.stage_shares import speed_shares
from paraplan.planners.table import register
from paraplan.plans.plan import LayerRange, Plan, Prediction, SearchInfo, Stage
from paraplan.plans.stage_widths import WIDE_SCHEDULES

UNIT_ABOVE = 16  # devices counted one by one up to this many; in whole nodes beyond
MAX_UNITS = 64  # the program's reach (L^2 x units^2; 64 nodes of 8 take seconds): beyond, skipped with its reason


@dataclass(frozen=True)
class Split:
    """The program's answer: the slowest stage's seconds per micro-batch, and each stage as (first
    layer, stop layer, first unit, stop unit)."""

    bottleneck_s: float
    stages: tuple[tuple[int, int, int, int], ...]


def replicated_dp(stage_s, boundary_s, n_layers: int, n_units: int, width_ok,
                  n_stages: int | None = None) -> list[Split | None]:
    """A(N, m) for every m = 1..n_units (index m - 1; None where no split exists): the program of
    the module docstring. `stage_s(j, lo, hi)` -> array over i = 0..j-1 of T(layers i..j-1 on units
    lo..hi-1); `boundary_s(w, lo)` -> array over i of 2 C_i (C_0 = 0) into a stage of w units from
    unit lo on; `width_ok(w)`: whether a stage may have w units. With `n_stages`, exactly that many
    stages (a count per state: A_k(j, m) from A_{k-1}; the request's exact stage count)."""
    inf = float("inf")
    levels = n_stages or 1  # without a count, one level whose predecessors are of any count
    best = np.full((levels + 1, n_layers + 1, n_units + 1), inf)
    choice: dict[tuple[int, int, int], tuple[int, int]] = {}  # (k, j, m) -> (i, w) of the last stage
    for j in range(1, n_layers + 1):
        for m in range(1, n_units + 1):
            for w in range(1, m + 1):
                if not width_ok(w):
                    continue
                t = stage_s(j, m - w, m)  # [i]
                if w == m:  # the first stage: layers 0..j-1 on units 0..m-1
                    if t[0] < best[1, j, m]:
                        best[1, j, m], choice[1, j, m] = t[0], (0, w)
                    continue
                edge = np.maximum(boundary_s(w, m - w)[1:j], t[1:j])
                for k in range(2, levels + 1) if n_stages else (1,):
                    cand = np.maximum(best[k - 1 if n_stages else k, 1:j, m - w], edge)
                    if cand.size:
                        i = int(np.argmin(cand))
                        if cand[i] < best[k, j, m]:
                            best[k, j, m], choice[k, j, m] = float(cand[i]), (i + 1, w)
    out: list[Split | None] = []
    for m in range(1, n_units + 1):
        if not np.isfinite(best[levels, n_layers, m]):
            out.append(None)
            continue
        stages, k, j, hi = [], levels, n_layers, m
        while j > 0:
            i, w = choice[k, j, hi]
            stages.append((i, j, hi - w, hi))
            j, hi, k = i, hi - w, (k - 1 if n_stages else k)
        out.append(Split(float(best[levels, n_layers, m]), tuple(reversed(stages))))
    return out


def _unit(request: PlanRequest) -> int:
    """Devices per unit of the program: one, or a node's devices beyond UNIT_ABOVE."""
    cluster = request.costs.cluster
    if cluster.n_devices <= UNIT_ABOVE:
        return 1
    sizes = {len(n.devices) for n in cluster.nodes}
    return sizes.pop() if len(sizes) == 1 else 1


def _reach(request: PlanRequest, limit_s: float) -> str | None:
    units = request.costs.cluster.n_devices // _unit(request)
    if units > MAX_UNITS:
        return (f"PipeDream's program over layers x devices reaches {MAX_UNITS} units (devices, or nodes beyond "
                f"{UNIT_ABOVE}); this cluster has {units}")
    return None


def _arrays(request: PlanRequest, rows: int, n_micro: int, unit: int):
    """The program's stage and boundary times for micro-batches of `rows` samples (n_micro of them)."""
    cm = request.costs
    layers = cm.model.layers
    n_units = cm.cluster.n_devices // unit
    kinds: dict[int, object] = {}  # one compute table per device kind
    kind_of = []
    for d in range(n_units * unit):
        c = cm.compute(d)
        kind_of.append(kinds.setdefault(id(c), c))
    prefix: dict[tuple[int, int], np.ndarray] = {}  # (kind, devices) -> cumulative fwd + bwd at rows/devices
    grads = np.concatenate(([0.0], np.cumsum([float(layer.param_bytes) for layer in layers])))

    def stage_s(j: int, lo: int, hi: int) -> np.ndarray:
        devices = (hi - lo) * unit
        present = {id(k): k for k in kind_of[lo * unit:hi * unit]}
        compute = np.zeros(j)
        for key, costs in present.items():
            if (key, devices) not in prefix:
                fwd, bwd, _, _ = costs.arrays(rows / devices)
                prefix[key, devices] = np.concatenate(([0.0], np.cumsum(fwd + bwd)))
            p = prefix[key, devices]
            compute = np.maximum(compute, p[j] - p[:j])
        if devices == 1:
            return compute
        link = cm.cluster.slowest_link(tuple(range(lo * unit, hi * unit)))
        # a ring all-reduce of the stage's gradients once an iteration, spread over its micro-batches
        sync = (2 * (devices - 1) / devices * (grads[j] - grads[:j]) / link.bandwidth_bytes_per_s
                + 2 * (devices - 1) * link.latency_s) / n_micro
        return np.maximum(compute, sync)

    sent: dict[int, np.ndarray] = {}  # devices -> bytes each receiving device takes and returns, per layer

    def boundary_s(w: int, lo: int) -> np.ndarray:
        devices = w * unit
        if devices not in sent:
            sent[devices] = np.array([0.0] + [layer.output_bytes.at(rows / devices) + layer.output_grad_bytes.at(
                rows / devices) for layer in layers[:-1]])
        link = cm.cluster.link(lo * unit - 1, lo * unit)  # between the two stages' neighbouring devices
        return sent[devices] / link.bandwidth_bytes_per_s + np.where(sent[devices] > 0, 2 * link.latency_s, 0.0)

    return stage_s, boundary_s, n_units


def _plan(request: PlanRequest, split: Split, n_micro: int, unit: int) -> Plan:
    schedule = request.schedule if request.schedule in WIDE_SCHEDULES else "1f1b"
    if schedule == "1f1b" and n_micro < len(split.stages):
        schedule = "gpipe"  # 1F1B needs a micro-batch per stage in flight
    stages = tuple(Stage(LayerRange(i, j), tuple(range(lo * unit, hi * unit))) for i, j, lo, hi in split.stages)
    return Plan(model=request.model_name, cluster=request.cluster_name, n_layers=request.costs.model.n_layers,
                global_batch=request.batch, n_micro=n_micro, schedule=schedule, grad_sync="after-backward",
                stages=stages)


def _closeness(prediction: Prediction) -> tuple[float, float]:
    """The fastest that fits; when none does, the closest to fitting."""
    return (0.0 if prediction.feasible else misfit(overflow(prediction)), prediction.iteration_s)


@register("pipedream-replicated", "PipeDream's dynamic program with replicated stages: each stage its own "
                                  "number of devices", schedules=("1f1b", "gpipe"), slow=6, reach=_reach)
def _planner(request: PlanRequest, options: dict, judge: Judge) -> Plan:
    t0 = time.perf_counter()
    unit = _unit(request)
    counts = (request.n_micro,) if request.n_micro else tuple(divisors(request.batch))
    best, tried = None, 0
    for n_micro in counts:
        rows = request.batch // n_micro
        if request.batch % n_micro:
            continue
        stage_s, boundary_s, n_units = _arrays(request, rows, n_micro, unit)
        splits = replicated_dp(stage_s, boundary_s, request.costs.model.n_layers, n_units,
                               lambda w, r=rows: r % (w * unit) == 0, request.n_stages)
        found = [(m, s) for m, s in enumerate(splits, start=1) if s is not None]
        if not found:
            continue
        everyone = [s for m, s in found if m == n_units]
        least = min(found, key=lambda x: (x[1].bottleneck_s, x[0]))[1]
        for split in everyone + ([least] if least not in everyone else []):
            if request.n_stages is not None and len(split.stages) != request.n_stages:
                continue
            plan = _plan(request, split, n_micro, unit)
            for candidate in (plan, speed_shares(request, plan)):
                if candidate is None:
                    continue
                prediction = judge(candidate)
                tried += 1
                if best is None or _closeness(prediction) < _closeness(best.prediction):
                    best = replace(candidate, prediction=prediction)
    if best is None:
        raise FieldError("batch", f"no split of the batch {request.batch} into micro-batches and stages of whole "
                                  "rows per device" + (f" with {request.n_stages} stages" if request.n_stages else ""))
    return replace(best, search=SearchInfo(planner="pipedream-replicated", search_s=time.perf_counter() - t0,
                                           options=(("costs", request.costs.source), ("unit", unit),
                                                    ("judged", tried))))
