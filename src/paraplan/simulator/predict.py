"""Simulate a Plan: iteration time, throughput, per-device busy/idle time and peak memory."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from paraplan.costs.memory import MemoryBreakdown, out_of_memory_reason, plan_memory
from paraplan.costs.model import CostModel
from paraplan.models.op_split import split_as_named
from paraplan.plans.features import refuse_features
from paraplan.plans.kinds import PlanKind
from paraplan.plans.plan import DeviceMemory, Plan, PlanError, Prediction
from paraplan.simulator import pipeline
from paraplan.simulator.dag import DagRun, run_dag_plan
from paraplan.simulator.engine import Timeline
from paraplan.simulator.plan_work import plan_work, zero_gather_s
from paraplan.simulator.time_split import TimeSplit, exposed_comm, split_time


@dataclass(frozen=True)
class DeviceStats:
    device: int
    busy_s: float  # compute stream busy during one iteration
    idle_s: float


@dataclass(frozen=True)
class Simulation:
    plan: Plan  # the input plan with its prediction filled in
    timeline: Timeline
    devices: tuple[DeviceStats, ...]
    memory: tuple[MemoryBreakdown, ...]
    bubble_fraction: float  # 1 - busy / (devices x iteration time), over the devices the plan uses
    dag: DagRun | None = None  # 'dag' plans: per-device operators, busy time, memory (simulator/dag.py)
    split: TimeSplit | None = None  # where the iteration goes, averaged over the cluster (simulator/time_split.py)

    @property
    def prediction(self) -> Prediction:
        return self.plan.prediction


# the version-2 plan features (plans/features.py: FEATURES) the simulator models so far
MODELLED: frozenset[str] = frozenset({"precision", "zero", "sequence_parallel", "selective", "schedule",
                                     "context_parallel", "expert_parallel", "expert_overlap",
                                     "expert_dispatcher"})


def simulate_plan(plan: Plan, cm: CostModel, contention: bool = True, split: bool = True,
                  one_replica: bool = False) -> Simulation:
    """`contention` (operator-placement plans only): transfers wait for busy ports; without it the
    makespan is the schedule's own critical-path length (FD-DPS eq. (10)). `split=False`: no
    `Simulation.split` (where the time goes, for people), which a search's judge does not read
    (a fifth of the Megatron grid's time at 1,024 GPUs); the prediction is the same. `one_replica`:
    data-parallel replicas alike simulated as one (pipeline.alike_replicas; the timeline then holds
    replica 0's devices alone, each other's drawn on them): the same prediction, for a search's judge."""
    refuse_features(plan, MODELLED, "the simulator")
    if plan.precision != cm.precision:
        raise PlanError(f"precision: the plan trains in {plan.precision} but the cost model prices {cm.precision}")
    if plan.fp8_param_gather != cm.fp8_param_gather:
        raise PlanError(f"fp8_param_gather: the plan gathers its parameters {'in FP8' if plan.fp8_param_gather else 'in bf16'}"
                        f" but the cost model prices {'FP8' if cm.fp8_param_gather else 'bf16'} gathers")
    if plan.fp8_recipe != cm.fp8_recipe:
        raise PlanError(f"fp8_recipe: the plan scales its FP8 casts {plan.fp8_recipe!r} but the cost model prices "
                        f"{cm.fp8_recipe!r}")
    if plan.kind is PlanKind.OPERATORS:
        return _simulate_dag_plan(plan, cm, contention)
    work = plan_work(plan, cm)
    if one_replica:
        work = pipeline.alike_replicas(work)
    result = pipeline.run(work, cm.overlap_slowdown)
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    memory, breakdown = plan_memory(plan, cm.model, capacities, cm.memory)
    # the optimizer's step after the schedule, on the device holding the most model states
    # (a measured rate: paraplan calibrate; 0 on uncalibrated clusters, as the papers' models)
    optimizer_s = cm.overheads.optimizer_step_s(max((b.states_bytes for b in breakdown), default=0.0))
    # the runtime's gradient-sync machinery per step beyond its link time (measured: paraplan calibrate)
    dp_sync = cm.overheads.dp_sync_s if plan.grad_sync != "none" else 0.0
    after = cm.overheads.step_for(len(set(plan.devices))) + optimizer_s + zero_gather_s(plan, cm) + dp_sync
    iteration = result.iteration_s + after
    # a stage group that computes together (Galvatron strategies) is drawn on its first device;
    # all of its devices are equally busy
    busy = result.timeline.compute_busy()
    exposed = exposed_comm(result.timeline) if split else {}
    spans = pipeline.ASYNC_ITERATIONS if work.schedule == "async-1f1b" else 1  # iterations the timeline holds
    per_device, per_device_exposed = {}, {}
    for stage in plan.stages:
        lead = work.replicas[0][plan.stages.index(stage)].device \
            if plan.kind is PlanKind.LAYERS or len(work.replicas) == 1 else None
        for d in stage.devices:
            drawn = lead if lead is not None else d
            per_device[d] = busy[drawn] / spans
            # async-1f1b: the timeline's ramps expose transfers that the steady state hides; no device
            # waits on communication longer than its iteration leaves it
            room = max(0.0, iteration - after - per_device[d])
            per_device_exposed[d] = tuple(min(x / spans, room) for x in exposed.get(drawn, (0.0, 0.0)))
    stats = tuple(DeviceStats(d, float(b), float(max(0.0, iteration - b))) for d, b in sorted(per_device.items()))
    reason = out_of_memory_reason(memory) or tensor_parallel_refusal(plan, cm.tensor_parallel)
    prediction = Prediction(iteration_s=iteration, throughput_samples_per_s=plan.global_batch / iteration,
                            memory=memory, feasible=not reason, reason=reason, cost_source=cm.source, engine=cm.engine)
    used_busy = np.array([s.busy_s for s in stats])
    bubble = float(1.0 - used_busy.sum() / (len(stats) * iteration)) if iteration > 0 else 0.0
    where = split_time(iteration, per_device, per_device_exposed, after, cm.cluster.n_devices) if split else None
    return Simulation(plan=replace(plan, prediction=prediction), timeline=result.timeline, devices=stats,
                      memory=breakdown, bubble_fraction=bubble, split=where)


def memory_verdict(plan: Plan, cm: CostModel) -> Prediction | None:
    """A layer plan's memory alone, before its timeline: the Prediction of a plan that does not fit
    (or that the runtime cannot shard) with its time not simulated (iteration_s inf), or None when
    it fits. A search that ranks plans that do not fit by memory alone (the Megatron grid) judges
    those in a fraction of the time: at 1,024 GPUs 352 of its 429 plans, 53 of its 78 s."""
    if plan.kind is PlanKind.OPERATORS:
        return None
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    memory, _ = plan_memory(plan, cm.model, capacities, cm.memory)
    reason = out_of_memory_reason(memory) or tensor_parallel_refusal(plan, cm.tensor_parallel)
    if not reason:
        return None
    return Prediction(iteration_s=math.inf, throughput_samples_per_s=0.0, memory=memory, feasible=False, reason=reason,
                      cost_source=cm.source, engine=cm.engine)


def verdict_if_large(plan: Plan, cm: CostModel, max_tasks: int) -> Prediction | None:
    """The memory's verdict of a layer plan that does not fit and whose timeline would take more than
    `max_tasks` simulator tasks (its replicas alike counted once); None otherwise (time it)."""
    if plan.kind is PlanKind.OPERATORS:
        return None
    try:  # the work first, as simulate_plan builds it: a plan it refuses is refused there, in its words
        if pipeline.task_count(pipeline.alike_replicas(plan_work(plan, cm))) <= max_tasks:
            return None
    except PlanError:
        return None
    return memory_verdict(replace(plan, **cm.plan_precision), cm)


def tensor_parallel_refusal(plan: Plan, runs: frozenset | None) -> str:
    """Why the plan is not runnable when it puts TP on a layer paraplan's runtime cannot shard
    (CostModel.tensor_parallel; issue 46: such a layer ran replicated, at tp times the predicted
    states), or ""."""
    if runs is None:
        return ""
    for s, stage in enumerate(plan.stages):
        for i, st in zip(stage.layers, stage.strategies, strict=False):
            if st.tp > 1 and (i, st.tp) not in runs:
                return (f"stages[{s}]: layer {i} with TP{st.tp}, which paraplan's runtime cannot shard "
                        "(runtime/layers/tensor_parallel.py; it runs TP at power-of-two degrees up to 64 on the layers "
                        "it knows how to split); plan it without TP there")
    return ""


def _simulate_dag_plan(plan: Plan, cm: CostModel, contention: bool) -> Simulation:
    if cm.operators is None:
        raise PlanError("operators: an operator-placement plan needs the model's operator graph "
                        "(models/op_trace.py builds it)")
    graph = split_as_named(cm.operators, [op for p in plan.operators for op in p.ops])
    run = run_dag_plan(plan, graph, cm, contention)
    used = sorted(p.device for p in plan.operators)
    step_s = cm.overheads.step_for(len(set(used)))
    iteration = run.timeline.makespan + step_s
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    memory = tuple(DeviceMemory(d, int(run.peak_bytes[d]), capacities[d]) for d in used)
    reason = out_of_memory_reason(memory)
    prediction = Prediction(iteration_s=iteration, throughput_samples_per_s=plan.global_batch / iteration,
                            memory=memory, feasible=not reason, reason=reason, cost_source=cm.source, engine=cm.engine)
    stats = tuple(DeviceStats(d, float(run.busy_s[d]), float(max(0.0, iteration - run.busy_s[d]))) for d in used)
    busy = np.array([s.busy_s for s in stats])
    bubble = float(1.0 - busy.sum() / (len(stats) * iteration)) if iteration > 0 else 0.0
    exposed = exposed_comm(run.timeline)
    split = split_time(iteration, {s.device: s.busy_s for s in stats}, exposed, step_s,
                       cm.cluster.n_devices)
    return Simulation(plan=replace(plan, prediction=prediction), timeline=run.timeline, devices=stats, memory=(),
                      bubble_fraction=bubble, dag=run, split=split)
