"""Say what you did (issue 12, point 3): a plan with fewer stages than asked says so and why in one
line (SearchInfo.note, saved in the plan file), and exact_stages holds every pipeline planner to
the asked count. Each test here failed before: there was no note and no exact_stages."""

import re

import pytest

from paraplan.costs.model import analytic_cost_model
from paraplan.errors import FieldError
from paraplan.hardware import load_cluster
from paraplan.models import measure, zoo
from paraplan.planners.registry import make_plan, planner, planner_names
from paraplan.planners.request import PlanRequest
from paraplan.plans.plan import SearchInfo
from paraplan.plans.plan_file import plan_from_json, plan_to_dict, plan_to_json

GIB = 2**30


@pytest.fixture(scope="module")
def vgg():
    return analytic_cost_model(measure.measure(zoo.build("vgg-16")), load_cluster("csimd-v100-1gbe"))


@pytest.fixture(scope="module")
def lenet():
    return analytic_cost_model(measure.measure(zoo.build("lenet-5")), load_cluster("gropipe-8xt4"))


def _request(cm, model, batch=64, **kw):
    return PlanRequest(costs=cm, model_name=model, cluster_name=cm.cluster.name, batch=batch, **kw)


def _ms(text: str) -> float:
    value, unit = text.split()
    return float(value) * (1e-3 if unit == "ms" else 1.0)


def test_csimd_says_why_it_uses_fewer_stages_than_asked(vgg):
    # vgg-16 over 1 GbE runs fastest on one V100: cutting costs more activation traffic than it saves
    plan = make_plan(_request(vgg, "vgg-16", n_stages=4), "csimd")
    assert plan.n_stages < 4
    note = plan.search.note
    assert "\n" not in note and "--" not in note and "exact_stages" in note, note
    assert note.startswith(f"csimd: {plan.n_stages} stage") and "of 8 devices" in note, note
    times = re.search(r"4 stages: ([\d.]+ m?s) vs ([\d.]+ m?s)", note)
    assert times, note
    forced, chosen = (_ms(t) for t in times.groups())
    assert chosen == pytest.approx(plan.prediction.iteration_s, rel=5e-3)  # the chosen plan's judged time
    exact = make_plan(_request(vgg, "vgg-16", n_stages=4, exact_stages=True), "csimd")
    assert forced == pytest.approx(exact.prediction.iteration_s, rel=5e-3)  # the best 4-stage plan's
    assert forced > chosen


def test_exact_stages_makes_csimd_use_the_stages_asked_for(vgg):
    plan = make_plan(_request(vgg, "vgg-16", n_stages=4, exact_stages=True), "csimd")
    assert plan.n_stages == 4 and plan.search.note == ""
    assert dict(plan.search.options)["exact_stages"] is True
    # and it is the best 4-stage division: brute force over exactly 4 stages agrees
    oracle = make_plan(_request(vgg, "vgg-16", n_stages=4, exact_stages=True), "brute-force")
    eq8 = [dict(p.search.options)["eq8_time_s"] for p in (plan, oracle)]
    assert oracle.n_stages == 4 and eq8[0] == pytest.approx(eq8[1], rel=1e-9)


def test_a_memory_reason_is_said_when_the_asked_stages_do_not_fit(vgg):
    # every device but the first holds no more than the reserve: no plan on more than one fits
    from dataclasses import replace

    from paraplan.hardware.cluster import Cluster, NodeSpec

    nodes = [vgg.cluster.nodes[0]] + [
        NodeSpec(n.name, tuple(replace(d, memory_bytes=vgg.memory.reserve_bytes) for d in n.devices), n.intra_link,
                 n.network) for n in vgg.cluster.nodes[1:]]
    cm = replace(vgg, cluster=Cluster(name=vgg.cluster.name, nodes=tuple(nodes)))
    plan = make_plan(_request(cm, "vgg-16", n_stages=4), "csimd")
    assert plan.prediction.feasible and plan.n_stages == 1
    note = plan.search.note
    assert "the best 4 stages do not fit (device 1 out of memory by" in note and "exact_stages forces 4" in note, note
    forced = make_plan(_request(cm, "vgg-16", n_stages=4, exact_stages=True), "csimd")
    assert forced.n_stages == 4 and not forced.prediction.feasible  # the closest to fitting, and it says so


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_exact_stages_holds_every_pipeline_planner_to_the_count(lenet, stages):
    for name in planner_names():
        if planner(name).needs_operators:  # operator placements have no stages (tests/unit/test_fddps_planners.py)
            continue
        request = _request(lenet, "lenet-5", batch=16, n_stages=stages, exact_stages=True)
        if name == "gropipe" and lenet.cluster.n_devices % stages:
            with pytest.raises(FieldError, match="do not split"):
                make_plan(request, name)
            continue
        plan = make_plan(request, name)
        assert plan.n_stages == stages, name
        assert plan.search.note == "", name


def test_exact_stages_is_validated_and_impossible_counts_name_the_field(lenet):
    with pytest.raises(FieldError) as caught:
        _request(lenet, "lenet-5", exact_stages=True)  # no count to hold to
    assert caught.value.field == "exact_stages" and " --" not in f" {caught.value}"
    with pytest.raises(FieldError) as caught:
        _request(lenet, "lenet-5", n_stages=2, exact_stages="yes")
    assert caught.value.field == "exact_stages"
    # six stages of LeNet-5's five layers: contiguous stages need a layer each
    for name in ("csimd", "even", "gropipe", "pipedream-layerwise"):
        with pytest.raises(FieldError) as caught:
            make_plan(_request(lenet, "lenet-5", n_stages=6, exact_stages=True), name)
        assert caught.value.field == "stages" and " --" not in f" {caught.value}", name
    # Bi-Partition under 1F1B needs a micro-batch per worker
    with pytest.raises(FieldError, match="micro-batches") as caught:
        make_plan(_request(lenet, "lenet-5", batch=4, n_stages=6, exact_stages=True), "bipartition")
    assert caught.value.field == "stages"


def test_bipartition_says_why_it_uses_fewer_workers(lenet):
    cm = analytic_cost_model(lenet.model, load_cluster("bipartition-7vm"))  # 100 Mbps: one worker is best
    plan = make_plan(_request(cm, "lenet-5", n_stages=5), "bipartition")
    assert plan.n_stages < 5
    note = plan.search.note
    assert note.startswith("bipartition: ") and "exact_stages forces 5" in note and "--" not in note, note
    assert re.search(r"5 workers: [\d.]+ m?s vs [\d.]+ m?s", note), note
    forced = make_plan(_request(cm, "lenet-5", n_stages=5, exact_stages=True), "bipartition")
    assert forced.n_stages == 5 and forced.prediction.iteration_s > plan.prediction.iteration_s


def test_the_note_is_saved_and_old_files_without_it_load(vgg):
    plan = make_plan(_request(vgg, "vgg-16", n_stages=4), "csimd")
    assert plan.search.note
    assert plan_from_json(plan_to_json(plan)).search.note == plan.search.note
    old = plan_to_dict(plan)
    del old["search"]["note"]
    import json

    assert plan_from_json(json.dumps(old)).search.note == ""
    assert SearchInfo(planner="x", search_s=0.0).note == ""
