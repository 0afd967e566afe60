"""Where a simulated iteration goes (simulator/time_split.py): the union measure against brute
force, the exposed communication against a sweep over the timeline's own intervals, the parts
adding up to the iteration, and devices a plan leaves unused counted idle."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from paraplan.planners.registry import make_plan
from paraplan.plans.plan import LayerRange, Stage
from paraplan.simulator.engine import COMPUTE
from paraplan.simulator.predict import simulate_plan
from paraplan.simulator.time_split import exposed_comm, union_length
from paraplan.workload import workload

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_union_length_is_the_measure_of_the_union():
    rng = np.random.default_rng(7)
    for _ in range(200):
        k = int(rng.integers(0, 8))
        start = rng.integers(0, 40, k).astype(float)
        end = start + rng.integers(0, 12, k)
        covered = np.zeros(60, dtype=bool)  # unit cells [t, t + 1): the intervals have integer ends
        for s, e in zip(start, end, strict=True):
            covered[int(s):int(e)] = True
        assert union_length(start, end) == pytest.approx(covered.sum())


def _sweep_exposed(timeline, device: int) -> tuple[float, float]:
    """Brute force: between consecutive endpoints of the device's intervals, the stretch counts when
    some communication lane of the device is busy and its compute lane is not (and, second, when
    one of those is a collective)."""
    compute, comm, collective = [], [], []
    for i in range(len(timeline.start)):
        lanes = ([int(timeline.device[i])] if timeline.type[i] == COMPUTE else
                 [int(timeline.device[i]), int(timeline.peer[i])] if timeline.groups[i] is None else
                 [int(d) for d in timeline.groups[i]])
        if device in lanes:
            interval = (timeline.start[i], timeline.end[i])
            (compute if timeline.type[i] == COMPUTE else comm).append(interval)
            if timeline.groups[i] is not None:
                collective.append(interval)
    points = sorted({t for iv in compute + comm for t in iv})
    total = synced = 0.0
    for a, b in zip(points, points[1:], strict=False):
        mid = (a + b) / 2
        if any(s <= mid < e for s, e in comm) and not any(s <= mid < e for s, e in compute):
            total += b - a
            synced += (b - a) if any(s <= mid < e for s, e in collective) else 0.0
    return total, synced


@pytest.mark.parametrize("model,cluster,batch,planner", [
    ("alexnet", "bipartition-7vm", 56, "pipedream-layerwise"),  # a pipeline on 100 Mbps links
    ("gpt2-tiny", "galvatron-8xtitan", 32, "dp"),  # bucketed all-reduces under the backward
    ("vgg-tiny", "fddps-8xp100", 32, "fddps"),  # an operator placement
])
def test_exposed_communication_matches_a_sweep_and_the_parts_add_up(model, cluster, batch, planner):
    w = workload(model, cluster, batch=batch, operators="optional")
    plan = make_plan(w.request, planner)
    sim = simulate_plan(plan, w.request.costs)
    split, timeline = sim.split, sim.timeline
    drawn = sorted({int(d) for d in timeline.device})
    exposed = exposed_comm(timeline)
    for d in drawn:
        assert exposed.get(d, (0.0, 0.0)) == pytest.approx(_sweep_exposed(timeline, d), abs=1e-12)
    assert 0 <= split.exposed_sync_s <= split.exposed_comm_s
    raw_idle = split.iteration_s - split.compute_s - split.exposed_comm_s - split.after_s
    assert raw_idle >= -1e-9 * split.iteration_s  # nothing counted twice
    assert split.compute_s == pytest.approx(sum(s.busy_s for s in sim.devices) / w.request.costs.cluster.n_devices)
    assert split.n_used == len(sim.devices)


def test_an_asynchronous_pipeline_s_parts_add_up_to_its_steady_state():
    """async-1f1b's iteration is the steady state's period; its timeline also holds the ramps, whose
    exposed transfers the steady state hides: no device is charged more than its iteration leaves."""
    w = workload("alexnet", "bipartition-7vm?nodes=2", batch=56)
    plan = replace(make_plan(w.request, "pipedream-layerwise"), schedule="async-1f1b", prediction=None, search=None)
    split = simulate_plan(plan, w.request.costs).split
    assert split.n_used == 2 and split.exposed_comm_s > 0
    raw_idle = split.iteration_s - split.compute_s - split.exposed_comm_s - split.after_s
    assert raw_idle >= -1e-9 * split.iteration_s


def test_a_one_device_plan_has_no_communication_and_the_others_idle():
    w = workload("gpt2-tiny", "galvatron-8xtitan", batch=8, seq_len=128)
    pipeline = make_plan(w.request, "even")
    whole = replace(pipeline, stages=(Stage(LayerRange(0, pipeline.n_layers), (0,)),), n_micro=2, prediction=None,
                    search=None)
    split = simulate_plan(whole, w.request.costs).split
    assert split.n_used == 1 and split.exposed_comm_s == 0
    # device 0 computes the whole iteration (and the step after it), the other seven wait
    assert split.compute_s * 8 + split.after_s * 8 == pytest.approx(split.iteration_s, rel=1e-9)
    assert split.idle_s == pytest.approx(split.iteration_s * 7 / 8, rel=1e-9)


def test_devices_a_plan_leaves_unused_are_idle_throughout():
    # pure data parallelism in Galvatron's trees, a power of two: 4 of Bi-Partition's 7 VMs
    w = workload("alexnet", "bipartition-7vm", batch=56)
    sim = simulate_plan(make_plan(w.request, "dp"), w.request.costs)
    split = sim.split
    assert split.n_devices == 7 and split.n_used == 4
    assert split.idle_s >= split.iteration_s * 3 / 7 * (1 - 1e-9)
