"""Our number for each of benchmarks/paper_fidelity.py's cells, and the fit of the device terms.

Every prediction is the simulator's (or the cost model's, for CSIMD's eq. (8) and FD-DPS's single
operators) on the cell's preset with the device terms under test put in its place. Memory is not
what the cells check: every plan is built with memory unbounded (MEMORY_BLIND), so that the paper's
plan at the paper's batch is the one priced even where our memory model would refuse it.

  dp / tp / pp / sdp  Galvatron's planner of that name at the cell's batch (`make_plan`: PP picks
                      its micro-batch count by its cost model, as the paper "manually tunes the
                      number of micro-batches to minimize the bubbles"); throughput in samples/s.
  gropipe             GroPipe's plan with the cell's N, k and m and the AMPA partition
                      (planners/gropipe/planner.py `plan_gropipe`), samples/s.
  single-gpu          the `dp` planner on one device of the preset, seconds per iteration.
  operator            the device model's time of one node of the aten graph (costs/op_costs.py), ms.
  ratio:<baseline>    over the column's runs (paper_fidelity.CSIMD_CASES): CSIMD eq. (8) time of
                      the even division with 1, 4 or batch micro-batches over that of our csimd
                      planner's division, memory-blind as the paper's comparison (benchmarks/
                      csimd_eval.py); the cell's statistic (min, average, max) of those ratios.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, replace

import numpy as np

from paraplan.hardware import load_cluster
from paraplan.hardware.cluster import Cluster, LinkSpec
from paraplan.planners.divisors import divisors
from paraplan.planners.registry import make_plan, planner_names
from paraplan.planners.request import PlanRequest
from paraplan.workload import cost_model, measured_model

MEMORY_BLIND = 2**40  # bytes per device
preset = functools.lru_cache(load_cluster)  # the presets as committed, parsed once


@dataclass(frozen=True)
class Terms:
    """The terms of one device type: device fields (max_efficiency: the efficiency of `precision`,
    the dtype the cells are priced in), link bandwidths (bytes/s) and the achieved memory bandwidth
    (None: the preset's own)."""

    max_efficiency: float
    half_efficiency_flops: float
    kernel_overhead_s: float
    intra_bandwidth: float | None = None
    network_bandwidth: float | None = None
    memory_bandwidth: float | None = None  # the device's achieved HBM / GDDR bandwidth
    precision: str = "fp32"  # not fitted


@dataclass(frozen=True)
class Family:
    """One device type: the presets it appears in, the terms fitted (at most 3) and their bounds."""

    name: str
    presets: tuple[str, ...]
    fitted: tuple[str, ...]  # Terms fields
    bounds: dict  # field -> (low, high), searched on a log scale
    precision: str = "fp32"  # the dtype the cells are priced in (its efficiency is the one fitted)
    not_written: str = ""  # why the fit is reported but not written to the presets (they keep ASSUMED)


# Bounds: what is physically plausible. A large fp32 kernel reaches at least a fifth of the
# datasheet peak and at most all of it; a kernel reaches half of that at 1e6 to 1e9 FLOPs (a 100^3 to
# 800^3 GEMM); launch + dispatch costs 2 to 50 us; a link carries at most its line rate (PCIe 3.0 x16
# 15.75 GB/s, 100 Gb/s InfiniBand 12.5 GB/s).
EFFICIENCY, HALF, OVERHEAD = (0.2, 1.0), (1e6, 1e9), (2e-6, 5e-5)
FAMILIES = (
    # Galvatron's TITANs: PCIe peer-to-peer is the links of TP, SDP and DP inside a node
    Family("titan-rtx", ("galvatron-8xtitan", "galvatron-16xtitan"),
           ("max_efficiency", "half_efficiency_flops", "intra_bandwidth"),
           {"max_efficiency": EFFICIENCY, "half_efficiency_flops": HALF, "intra_bandwidth": (2e9, 15.75e9)}),
    # the fp32 efficiency of the one A100 compute model (galvatron-16xa100, -64xa100 and dgx-a100-80gb;
    # its bf16 / fp16 / tf32 terms stay as benchmarks/efficiency_fit.py left them) and the Galvatron
    # clusters' 100 Gb/s InfiniBand
    Family("a100-fp32", ("galvatron-16xa100", "galvatron-64xa100"), ("max_efficiency", "network_bandwidth"),
           {"max_efficiency": EFFICIENCY, "network_bandwidth": (2e9, 12.5e9)}),
    Family("t4", ("gropipe-8xt4",), ("max_efficiency", "half_efficiency_flops", "kernel_overhead_s"),
           {"max_efficiency": EFFICIENCY, "half_efficiency_flops": HALF, "kernel_overhead_s": OVERHEAD}),
    Family("p100", ("fddps-8xp100",), ("max_efficiency", "half_efficiency_flops"),
           {"max_efficiency": EFFICIENCY, "half_efficiency_flops": HALF}),
    # CSIMD's cells are ratios: they weigh compute against transfers but do not pin a device's speed.
    # The fit runs every term to its bound, a V100 slower than the fitted T4 at large kernels (0.2 x 14
    # against 0.397 x 8.1 TFLOP/s): reported, not written
    Family("v100", ("csimd-v100-10gbe", "csimd-v100-1gbe"), ("max_efficiency", "half_efficiency_flops", "kernel_overhead_s"),
           {"max_efficiency": EFFICIENCY, "half_efficiency_flops": HALF, "kernel_overhead_s": OVERHEAD},
           not_written="every term at a bound; a V100 slower than a T4"),
)
# the terms the presets had before this fit (assumed, not measured), for the report
ASSUMED = {"titan-rtx": (0.7, 5.0e7, 1.0e-5, 10.0e9), "a100-fp32": (0.7, 8.0e7, 8.0e-6, None, 11.5e9),
           "t4": (0.7, 3.0e7, 1.0e-5), "p100": (0.7, 4.0e7, 1.0e-5), "v100": (0.7, 5.0e7, 1.0e-5)}
FAMILY_OF = {preset: f for f in FAMILIES for preset in f.presets}
# Not written to the presets: the A100 cells priced in TF32 instead (what PyTorch ran fp32 matmuls in
# on Ampere by default before 1.12), to test that reading of Galvatron's A100 tables
A100_TF32 = Family("a100-tf32", ("galvatron-16xa100", "galvatron-64xa100"), ("max_efficiency", "network_bandwidth"),
                   {"max_efficiency": (0.05, 1.0), "network_bandwidth": (2e9, 12.5e9)}, precision="tf32")
ASSUMED["a100-tf32"] = (0.869, 8.0e7, 8.0e-6, None, 11.5e9)


def preset_terms(family: Family) -> Terms:
    """The terms as the family's last preset has them now (its links only where fitted)."""
    cluster = preset(family.presets[-1])
    d, node = cluster.devices[0].spec, cluster.nodes[0]
    return Terms(d.efficiency_for(family.precision), d.half_efficiency_flops, d.kernel_overhead_s,
                 node.intra_link.bandwidth_bytes_per_s if "intra_bandwidth" in family.fitted else None,
                 node.network.bandwidth_bytes_per_s if "network_bandwidth" in family.fitted else None,
                 d.memory_bandwidth_bytes_per_s if "memory_bandwidth" in family.fitted else None, family.precision)


def with_terms(cluster: Cluster, terms: Terms | None) -> Cluster:
    """The preset with the terms in place (the efficiency of the terms' dtype only); None: the preset
    as committed."""
    if terms is None:
        return cluster.with_memory(MEMORY_BLIND)

    def link(lk: LinkSpec, bandwidth: float | None) -> LinkSpec:
        return lk if bandwidth is None else replace(lk, bandwidth_bytes_per_s=bandwidth)

    spec = cluster.devices[0].spec
    device = {"half_efficiency_flops": terms.half_efficiency_flops, "kernel_overhead_s": terms.kernel_overhead_s}
    if terms.precision == "fp32":
        device["max_efficiency"] = terms.max_efficiency
    else:
        device["other_efficiencies"] = tuple(sorted({**dict(spec.other_efficiencies),
                                                     terms.precision: terms.max_efficiency}.items()))
    if terms.memory_bandwidth is not None:
        device["memory_bandwidth_bytes_per_s"] = terms.memory_bandwidth
    nodes = tuple(replace(n, devices=tuple(replace(d, **device) for d in n.devices),
                          intra_link=link(n.intra_link, terms.intra_bandwidth),
                          network=link(n.network, terms.network_bandwidth)) for n in cluster.nodes)
    return replace(cluster, nodes=nodes).with_memory(MEMORY_BLIND)


class Predictor:
    """Predictions of cells under given terms; models are measured once and kept."""

    def __init__(self):
        planner_names()  # every planner registered (the split planners are looked up by name)
        self._specs: dict = {}
        self._ratios: dict = {}  # (column, terms) -> the column's runs' ratios
        self._costs: dict = {}
        self._graph = None

    def spec(self, model: str, seq_len: int | None = None):
        if (model, seq_len) not in self._specs:
            self._specs[(model, seq_len)] = measured_model(model, seq_len=seq_len)[1]
        return self._specs[(model, seq_len)]

    def predict(self, cell, terms: Terms | None = None) -> float:
        """Our number for the cell under `terms` (None: the presets as committed, in fp32)."""
        cluster = with_terms(preset(cell.cluster), terms)
        precision = terms.precision if terms is not None else "fp32"
        if cell.plan.startswith("ratio:"):
            return self._ratio(cell, terms)
        if cell.plan == "operator":
            return self._operator_ms(cell, cluster)
        if cell.plan == "single-gpu":
            one = replace(cluster, nodes=(replace(cluster.nodes[0], devices=cluster.nodes[0].devices[:1]),))
            return self._layer_plan(cell, one, "dp", precision).prediction.iteration_s
        if cell.plan == "gropipe":
            return self._gropipe(cell, cluster, precision)
        # PP: every micro-batch count that divides the batch, the fastest kept (the paper "manually
        # tunes the number of micro-batches to minimize the bubbles", Galvatron-BMW §VII-A; the pp
        # planner alone tries only P, 2P and 4P, and 1 when none divides: no pipelining at batch < P)
        # counts below the stage count P are left out: a bubble of over half the iteration
        counts = [m for m in divisors(cell.batch) if m >= min(cluster.n_devices, cell.batch)] \
            if cell.plan == "pp" else (None,)
        plans = [self._layer_plan(cell, cluster, cell.plan, precision, m) for m in counts]
        assert all(p.global_batch == cell.batch for p in plans), cell
        return max(p.prediction.throughput_samples_per_s for p in plans)

    def costs(self, model: str, cluster: Cluster, precision: str, seq_len: int | None = None):
        """The cost model of a model on a cluster (kept while the terms are the same)."""
        key = (model, seq_len, cluster, precision)
        if key not in self._costs:
            if len(self._costs) > 64:
                self._costs.clear()
            self._costs[key] = cost_model(self.spec(model, seq_len), cluster, precision=precision)
        return self._costs[key]

    def _layer_plan(self, cell, cluster: Cluster, planner: str, precision: str, n_micro: int | None = None):
        cm = self.costs(cell.model, cluster, precision)
        return make_plan(PlanRequest(costs=cm, model_name=cell.model, cluster_name=cluster.name, batch=cell.batch,
                                     n_micro=n_micro), planner)

    def _gropipe(self, cell, cluster: Cluster, precision: str) -> float:
        from paraplan.planners.gropipe.planner import plan_gropipe
        from paraplan.planners.registry import simulator_judge

        groups, stages, n_micro = cell.detail
        cm = self.costs(cell.model, cluster, precision)
        request = PlanRequest(costs=cm, model_name=cell.model, cluster_name=cluster.name, batch=cell.batch)
        _, table = plan_gropipe(request, simulator_judge(request), micro_batches=(n_micro,), shapes=[(groups, stages)])
        row = next(r for r in table if r["division"] == "ampa")  # the paper's partition
        return cell.batch / row["iteration_s"]

    def _operator_ms(self, cell, cluster: Cluster) -> float:
        from paraplan.costs.op_costs import analytic_op_seconds
        from paraplan.models import zoo
        from paraplan.models.op_trace import build_op_graph

        if self._graph is None:
            self._graph = build_op_graph(zoo.build(cell.model))
        i = self._graph.index()[cell.detail[0]]
        return 1e3 * float(analytic_op_seconds(self._graph, cluster.devices[0].spec, cell.batch)[i])

    def case_ratios(self, case: tuple, terms: Terms | None) -> dict[str, float]:
        """One CSIMD run: eq. (8) time of each even-division baseline over CSIMD's."""
        from paraplan.planners.pipeline_split import build_problem, plan_split

        model, preset_name, batch, n_stages, seq_len = case
        cluster = with_terms(preset(preset_name), terms)
        cm = self.costs(model, cluster, terms.precision if terms is not None else "fp32", seq_len)
        n_stages = min(n_stages, cm.model.n_layers)
        problem = build_problem(cm, batch, n_stages)

        def eq8(planner: str, **kwargs) -> float:
            plan = plan_split(cm, model, preset_name, batch, planner, n_stages=n_stages, **kwargs)
            return problem.time_s([s.layers.stop - 1 for s in plan.stages[:-1]], plan.n_micro)

        csimd = eq8("csimd")
        return {f"gpipe-e-{label}": eq8("even", n_micro=p) / csimd
                for label, p in (("1", 1), ("4", 4), ("bs", batch))}

    def _ratio(self, cell, terms: Terms | None) -> float:
        import paper_fidelity

        statistic, column = cell.detail
        key = (column, terms)
        if key not in self._ratios:  # the column's runs under these terms, once for its cells
            self._ratios[key] = [self.case_ratios(case, terms) for case in paper_fidelity.CSIMD_CASES[column]]
        ratios = [r[cell.plan.split(":", 1)[1]] for r in self._ratios[key]]
        return {"min": min, "average": statistics.mean, "max": max}[statistic](ratios)


def log_errors(predictor: Predictor, cells, terms: Terms) -> np.ndarray:
    return np.array([math.log(predictor.predict(c, terms) / c.measured) for c in cells])


def fit(predictor: Predictor, family: Family, cells, start: Terms, rounds: int = 3, points: int = 7) -> Terms:
    """The terms minimising the sum of squared log errors over `cells` (the family's fit cells):
    coordinate descent over the fitted fields, each searched on a log grid of `points` values
    within its bounds, the grid narrowed around the best value each round (no scipy here)."""
    best = start
    for name in family.fitted:  # start inside the bounds
        low, high = family.bounds[name]
        best = replace(best, **{name: min(max(getattr(best, name), low), high)})
    best_err = float(np.sum(log_errors(predictor, cells, best) ** 2))
    span = {name: math.log(family.bounds[name][1] / family.bounds[name][0]) for name in family.fitted}
    for r in range(rounds):
        for name in family.fitted:
            low, high = family.bounds[name]
            centre = math.log(getattr(best, name)) if r else math.log(low * high) / 2  # round 0: the whole range
            grid = np.exp(np.linspace(max(math.log(low), centre - span[name] / 2),
                                      min(math.log(high), centre + span[name] / 2), points))
            for value in grid:
                trial = replace(best, **{name: float(value)})
                err = float(np.sum(log_errors(predictor, cells, trial) ** 2))
                if err < best_err:
                    best, best_err = trial, err
            span[name] /= 3
    return best
