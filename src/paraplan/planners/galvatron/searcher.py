"""Galvatron-BMW's search for one request and variant (../shared/papers/galvatron-bmw.md): one
dynamic program per stage (eq. (4), Algorithm 3, planners/galvatron/dp.py) under its exact memory
over the per-layer strategy arrays of its device group (planners/galvatron/arrays.py), and a
partition's plan and its eq. (8) estimate. Which partitions are searched, Algorithm 2's partition
adjustment (`Searcher.bmw`) and the batch search's quick memory probe (`Searcher.fits`) are
planners/galvatron/partitions.py; the batch search is planners/galvatron/batch.py. The planners
that use it are planners/galvatron/planner.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from paraplan.costs.memory import micro_batches_in_flight, rank_memory
from paraplan.costs.memory_config import GIB, MemoryConfig
from paraplan.planners.galvatron import partitions
from paraplan.planners.galvatron.arrays import StrategyArrays
from paraplan.planners.galvatron.dp import INF, pipeline_cost, search_stage
from paraplan.planners.galvatron.partitions import BMW_PARTITION, BMW_PARTS, bmw_parts  # noqa: F401 (their old home)
from paraplan.planners.galvatron.space import Variant, stage_group
from paraplan.planners.request import PlanRequest, cost_model_cache
from paraplan.plans.plan import LayerRange, Plan, Stage


def _size(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= GIB / 10 else f"{nbytes / 2**20:.1f} MiB"


@dataclass
class StageResult:
    """One stage's search result and what eq. (8) needs of it."""

    choice: tuple[int, ...]
    per_micro_s: float  # forward + backward (+ transformations, runtime actions) of one micro-batch
    sync_s: float  # what the gradient sync adds to the last micro-batch
    failure: str = ""  # why nothing fits ("" when it does)


@dataclass
class SearchResult:
    estimate_s: float  # eq. (8) iteration time (inf: does not fit)
    plan: Plan
    overflow: float = 0.0  # when it does not fit: the largest peak / capacity
    reason: str = ""
    origin: str = "even"  # the partition's origin in Algorithm 2: even, memory (p_m), time (p_t), adjusted
    # the best result of every pipeline degree and micro-batch count searched (batch.py: search_batch),
    # for the simulator to rank: eq. (8) sums every stage's gradient sync, which run at once on their
    # own devices, and misranks the counts of one degree (planners/galvatron/judging.py: judge_candidates)
    finalists: tuple = ()


# The arrays and stage results of the last cost model searched, per what they depend on (`_shared`):
# Galvatron-Base's search is BMW's on the even partitions, and in a comparison the two run in one
# process (planners/auto.py: PlannerSpec.rides_with), the second reading the first's dynamic programs
_SHARED: dict = {}


def _shared(request: PlanRequest, variant: Variant, bins: int) -> tuple[StrategyArrays, dict]:
    """(the per-layer arrays, the stage results) of every search with the same cost model, batch,
    strategies and memory granularity: the same numbers, computed once."""
    shared = cost_model_cache(_SHARED, request.costs)
    key = (variant.dims, variant.checkpoint, variant.pp, variant.fixed_3d, bins, request.batch,
           request.n_devices, request.sequence_parallel, request.tensor_parallel,
           int(request.options.get("context_parallel", 1)))
    if key not in shared:
        shared[key] = (StrategyArrays(request, variant), {})
    return shared[key]


class Searcher:
    """Every search of one request and variant, with the per-layer arrays and stage results cached
    (shared with the other searches of the same cost model and strategies: `_shared`)."""

    def __init__(self, request: PlanRequest, variant: Variant, bins: int):
        self.request, self.variant, self.bins = request, variant, bins
        self.cm = request.costs
        self.model, self.cluster = self.cm.model, self.cm.cluster
        self.config = self.cm.memory or MemoryConfig()
        self.slow = self.cm.overlap_slowdown
        # arrays(devices, micro): the group's [layer, strategy] arrays
        self.arrays, self._stages = _shared(request, variant, bins)
        self.capacity = {d.id: d.spec.memory_bytes for d in self.cluster.devices}
        self._least: dict = {}  # per device group, its least capacity
        # layers sharing a weight: those that use one another layer owns, and its owners
        self.tied = {i for i, layer in enumerate(self.model.layers) if layer.shared_param_bytes} | \
            {o for layer in self.model.layers for o in layer.shared_owners}

    def least_capacity(self, devices: tuple[int, ...]) -> int:
        if devices not in self._least:
            self._least[devices] = min(self.capacity[d] for d in devices)
        return self._least[devices]

    def group(self, n_stages: int, s: int) -> tuple[int, ...]:
        g = 1 if self.variant.pp == "all" else stage_group(self.request.n_devices, n_stages)
        return tuple(range(s * g, (s + 1) * g))  # pure PP: one device a stage; else a power of two

    def problem(self, n_stages: int, s: int, start: int, stop: int, n_micro: int, schedule: str,
                reduction: float = 0.0) -> dict:
        """Stage s's dynamic program (eq. (4) inputs): cost [layer, strategy] (the objective: m
        micro-batches of forward + backward and the overlapped gradient sync of the last), forward
        memory O_f + O_ms and backward memory O_b in bytes, R per micro-batch [layer, class, class],
        the capacity and the memory unit."""
        devices = self.group(n_stages, s)
        micro = self.request.batch / n_micro
        a = self.arrays(devices, micro)
        rows = slice(start, stop)
        fwd, bwd, ar = a["forward_s"][rows], a["backward_s"][rows], a["grad_allreduce_s"][rows]
        both = np.minimum(bwd, ar)
        sync = both * self.slow + np.maximum(bwd, ar) - both - bwd  # the overlapped all-reduce's extra (§V)
        # ZeRO-1/2's all-gather after the optimizer step: nothing to overlap it with
        sync = sync + a["after_step_s"][rows]
        per_micro = fwd + bwd
        in_flight = micro_batches_in_flight(schedule, n_stages, s, n_micro)
        memory = self.least_capacity(devices)
        # a tied weight (GPT-2's embedding and head) is summed between its stages after the dp sync:
        # the runtime runs no ZeRO on it (runtime/layers/hybrid.py: hybrid_refusal), so neither do plans
        zero = np.array([s.zero > 0 for s in a["strategies"]])
        tied = np.array([i in self.tied for i in range(start, stop)])
        allowed = a["allowed"][rows] & ~(tied[:, None] & zero[None, :])
        return {"arrays": a, "devices": devices, "micro": micro, "per_micro": per_micro, "sync": sync,
                "cost": np.where(allowed, n_micro * per_micro + sync, INF),
                "forward_bytes": a["states_bytes"][rows] + in_flight * (a["saved_bytes"][rows]
                                                                        + a["extra_forward"][rows]),
                "backward_bytes": a["recompute_bytes"][rows] + a["extra_backward"][rows], "memory": memory,
                "capacity": memory - self.config.reserve_bytes - reduction, "unit": memory / self.bins,
                "trans": self.arrays.transformation(a, range(start, stop), micro, devices), "classes": a["classes"]}

    def stage(self, n_stages: int, s: int, start: int, stop: int, n_micro: int, schedule: str,
              reduction: float = 0.0) -> StageResult:
        in_flight = micro_batches_in_flight(schedule, n_stages, s, n_micro)
        key = (n_stages, s, start, stop, n_micro, in_flight, reduction)  # the schedule matters only here
        if key in self._stages:
            return self._stages[key]
        pr = self.problem(n_stages, s, start, stop, n_micro, schedule, reduction)
        a, devices, micro, memory, capacity = pr["arrays"], pr["devices"], pr["micro"], pr["memory"], pr["capacity"]
        per_micro, sync, trans, fmem, bmem = pr["per_micro"], pr["sync"], pr["trans"], pr["forward_bytes"], \
            pr["backward_bytes"]
        sol = search_stage(pr["cost"], fmem, bmem, n_micro * trans, capacity, pr["unit"], pr["classes"])
        if np.isfinite(sol.cost):
            idx = np.array(sol.choice)
            r = np.arange(stop - start)
            cls = a["classes"][idx]
            moves = float(trans[r[1:], cls[:-1], cls[1:]].sum()) if len(idx) > 1 else 0.0
            result = StageResult(sol.choice, float(per_micro[r, idx].sum()) + moves + 2 * self.cm.overheads.action_s,
                            float(sync[r, idx].sum()))
        else:  # the least memory per layer, and why nothing fits
            allowed = a["allowed"][start:stop]
            need = np.where(allowed, fmem + bmem, INF)
            choice = tuple(int(k) for k in np.argmin(need, axis=1))
            stuck = np.flatnonzero(~allowed.any(axis=1))  # layers no strategy of this variant may take
            if len(stuck) and any(micro == int(micro) and int(micro) % st.data_degree == 0 for st in a["strategies"]):
                why = (f"paraplan's runtime runs no tensor parallelism on layer {start + int(stuck[0])}, and every "
                       f"strategy of this search over "
                       f"{len(devices)} devices that splits its micro-batch uses it")
            elif len(stuck):
                why = f"no strategy of {len(devices)} devices splits a micro-batch of {micro:g} samples"
            else:
                worst = int(np.argmax(need.min(axis=1)))
                if need[worst].min() > capacity:
                    why = (f"every strategy of layer {start + worst} needs more than {_size(memory)} "
                           f"on stage {s + 1} of {n_stages}")
                else:
                    why = (f"layers {start}-{stop - 1} need more than {_size(memory)} per device together "
                           f"(stage {s + 1} of {n_stages})")
            result = StageResult(choice, INF, 0.0, why)
        self._stages[key] = result
        return result

    def evaluate(self, sizes: tuple[int, ...], n_micro: int, schedule: str) -> SearchResult:
        """One partition: a dynamic program per stage, the plan, its eq. (8) cost and memory check."""
        n_stages = len(sizes)
        bounds = np.concatenate(([0], np.cumsum(sizes))).astype(int)
        reductions = [0.0] * n_stages
        for _ in range(5):  # re-search a stage that the simulator's memory count finds over capacity
            stages = [self.stage(n_stages, s, int(bounds[s]), int(bounds[s + 1]), n_micro, schedule, reductions[s])
                      for s in range(n_stages)]
            plan = self.build(sizes, bounds, stages, n_micro, schedule)
            # each stage's largest excess over its devices' capacity, from one breakdown a stage (the
            # simulator's count, costs/memory.py plan_memory, as bytes a device; a row for each of 1,024
            # devices had been a tenth of BMW's partition adjustment at 1,024 GPUs)
            overflow, over = 0.0, {s: -float("inf") for s in range(n_stages)}
            for s, (devices, b, each) in enumerate(rank_memory(plan, self.model, self.config)):
                pairs = [(each[d].peak_bytes, self.capacity[d]) for d in devices] if each else \
                    [(b.peak_bytes, self.least_capacity(devices))]  # one breakdown for the stage's devices alike
                for peak, capacity in ((int(round(p)), c) for p, c in pairs):
                    overflow, over[s] = max(overflow, peak / max(capacity, 1)), max(over[s], peak - capacity)
            failures = [st.failure for st in stages if st.failure]
            if failures:
                return SearchResult(INF, plan, overflow, failures[0])
            if all(v <= 0 for v in over.values()):
                return SearchResult(self.estimate(plan, stages, n_micro), plan)
            reductions = [r + max(0.0, over[s]) for s, r in enumerate(reductions)]
        return SearchResult(INF, plan, overflow, "the memory model holds more than the search counted")

    def build(self, sizes, bounds, stages: list[StageResult], n_micro: int, schedule: str) -> Plan:
        n_stages = len(sizes)
        out, any_dp = [], False
        for s, st in enumerate(stages):
            devices = self.group(n_stages, s)
            strategies = self.arrays(devices, self.request.batch / n_micro)["strategies"]
            chosen = tuple(strategies[k] for k in st.choice)
            any_dp = any_dp or any(x.dp > 1 for x in chosen)
            out.append(Stage(LayerRange(int(bounds[s]), int(bounds[s + 1])), devices, strategies=chosen))
        return Plan(model=self.request.model_name, cluster=self.request.cluster_name, n_layers=self.model.n_layers,
                    global_batch=self.request.batch, n_micro=n_micro, schedule=schedule, stages=tuple(out),
                    grad_sync="bucketed" if any_dp else "none")

    def estimate(self, plan: Plan, stages: list[StageResult], n_micro: int) -> float:
        micro = plan.global_batch / n_micro
        sends = []
        for s in range(plan.n_stages - 1):
            here, there = plan.stages[s], plan.stages[s + 1]
            link = self.cluster.link(here.devices[0], there.devices[0])
            last, first = here.strategy(here.layers.stop - 1), there.strategy(there.layers.start)
            layer = self.model.layers[here.layers.stop - 1]
            sends.append(link.transfer_s(layer.output_bytes.at(micro / last.data_degree))
                         + link.transfer_s(layer.output_grad_bytes.at(micro / first.data_degree)))
        return pipeline_cost([st.per_micro_s for st in stages], [st.sync_s for st in stages], sends,
                             n_micro) + self.cm.overheads.step_for(self.cluster.n_devices)

    def fits(self, n_stages: int, n_micro: int, schedule: str) -> bool:
        """The batch search's quick memory probe (partitions.py: fits)."""
        return partitions.fits(self, n_stages, n_micro, schedule)

    def parts(self) -> frozenset[str]:
        """The partitions BMW searches (the request's `bmw_partition`, default even+biobj)."""
        return partitions.searched_parts(self.request)

    def bmw(self, n_stages: int, n_micro: int, schedule: str, start: SearchResult) -> list[SearchResult]:
        """Algorithm 2's partition adjustment from the even partition's result (partitions.py:
        adjust_partition); each result's `origin` says where its partition came from."""
        return partitions.adjust_partition(self, n_stages, n_micro, schedule, start)
