"""The Plan: JSON round-trips of every method's shape, and errors that name the field."""

import json

import pytest

from paraplan.plans.plan import (
    DeviceMemory,
    LayerRange,
    LayerStrategy,
    OperatorPlacement,
    Plan,
    PlanError,
    Prediction,
    SearchInfo,
    Stage,
    check_fits,
    validate,
)
from paraplan.plans.plan_file import plan_from_json, plan_to_dict, plan_to_json, read_plan, write_plan

PREDICTION = Prediction(iteration_s=0.25, throughput_samples_per_s=256.0,
                        memory=(DeviceMemory(0, 10 * 2**30, 16 * 2**30), DeviceMemory(1, 17 * 2**30, 16 * 2**30)),
                        feasible=False, reason="device 1 out of memory by 1.00 GiB")


def csimd_plan() -> Plan:  # contiguous stages, one device each, p micro-batches, GPipe
    return Plan(model="gpt2-xl", cluster="csimd-v100-10gbe", n_layers=50, global_batch=64, n_micro=8,
                schedule="gpipe", grad_sync="none",
                stages=(Stage(LayerRange(0, 20), (0,)), Stage(LayerRange(20, 35), (1,)), Stage(LayerRange(35, 50), (2,))),
                search=SearchInfo("csimd", 0.12, (("eta", 1000), ("objective", "eq8"))))


def gropipe_plan() -> Plan:  # N=2 groups x k=4 stages, delayed asynchronous all-reduce
    stages = tuple(Stage(LayerRange(a, b), (s, s + 4)) for s, (a, b) in enumerate([(0, 5), (5, 10), (10, 14), (14, 18)]))
    return Plan(model="resnet-50", cluster="gropipe-8xt4", n_layers=18, global_batch=256, n_micro=4,
                schedule="1f1b", grad_sync="gropipe-delayed", stages=stages, prediction=PREDICTION)


def galvatron_plan() -> Plan:  # per-layer hybrid strategies over 4-device stages
    s0 = tuple(LayerStrategy(dp=2, tp=2) if i < 10 else LayerStrategy(sdp=4, recompute="full") for i in range(17))
    s1 = tuple(LayerStrategy(tp=4) for _ in range(17))
    return Plan(model="bert-huge-32", cluster="galvatron-8xtitan", n_layers=34, global_batch=64, n_micro=4,
                schedule="1f1b", grad_sync="bucketed",
                stages=(Stage(LayerRange(0, 17), (0, 1, 2, 3), strategies=s0),
                        Stage(LayerRange(17, 34), (4, 5, 6, 7), strategies=s1)),
                prediction=Prediction(1.5, 42.7, (DeviceMemory(0, 7 * 2**30, 8 * 2**30),)))


def bipartition_plan() -> Plan:  # separate forward and backward ranges
    return Plan(model="vgg-16", cluster="bipartition-7vm", n_layers=16, global_batch=128, n_micro=4,
                schedule="1f1b", grad_sync="none",
                stages=(Stage(LayerRange(0, 6), (0,), backward_layers=LayerRange(0, 8)),
                        Stage(LayerRange(6, 16), (1,), backward_layers=LayerRange(8, 16))))


def fddps_plan() -> Plan:  # operator placement with a per-device order
    return Plan(model="resnet-50", cluster="fddps-8xp100", n_layers=18, global_batch=32, n_micro=1,
                schedule="dag", grad_sync="after-backward",
                operators=(OperatorPlacement(0, ("conv1", "bn1", "conv2/part0")),
                           OperatorPlacement(1, ("conv2/part1", "fc"))))


ALL = [csimd_plan, gropipe_plan, galvatron_plan, bipartition_plan, fddps_plan]


@pytest.mark.parametrize("make", ALL, ids=lambda f: f.__name__)
def test_round_trip_through_json(make, tmp_path):
    plan = make()
    assert validate(plan) is plan
    assert plan_from_json(plan_to_json(plan)) == plan
    path = tmp_path / "plan.json"
    write_plan(plan, path)
    assert read_plan(path) == plan
    assert json.loads(path.read_text())["format_version"] == 2


def test_version_2_fields_round_trip():
    from dataclasses import replace

    plan = galvatron_plan()
    stage = plan.stages[0]
    richer = tuple(replace(x, recompute="selective", zero=1 if x.dp > 1 else 0, sequence_parallel=x.tp > 1)
                   for x in stage.strategies)
    plan = replace(plan, precision="bf16", stages=(replace(stage, strategies=richer), *plan.stages[1:]))
    again = plan_from_json(plan_to_json(plan))
    assert again == plan and again.precision == "bf16"
    assert {x.recompute for x in again.stages[0].strategies} == {"selective"}
    data = json.loads(plan_to_json(plan))
    assert data["precision"] == "bf16" and data["schedule"] == {"kind": str(plan.schedule), "virtual_stages": 1}


def test_a_version_1_file_loads_unchanged_as_fp32():
    """Version 1: `schedule` a string, `checkpoint` per strategy, no precision: the same plan, fp32,
    full recomputation where checkpoint was true."""
    data = plan_to_dict(galvatron_plan())
    v1 = {**data, "format_version": 1, "schedule": data["schedule"]["kind"]}
    v1.pop("precision")
    for stage in v1["stages"]:
        for x in stage.get("strategies", []):
            x["checkpoint"] = x.pop("recompute") == "full"
    loaded = plan_from_json(json.dumps(v1))
    assert loaded == galvatron_plan() and loaded.precision == "fp32"
    assert any(x.checkpoint for s in loaded.stages for x in s.strategies)  # the fixture checkpoints some layers


def test_round_trip_keeps_prediction_and_search():
    from dataclasses import replace

    plan = replace(csimd_plan(), prediction=Prediction(1.0, 64.0, (DeviceMemory(0, 1, 2), DeviceMemory(2, 3, 4)),
                                                       feasible=False, reason="device 2 out of memory"))
    again = plan_from_json(plan_to_json(plan))
    assert again.prediction == plan.prediction and again.search == plan.search


def test_derived_views():
    plan = gropipe_plan()
    assert plan.n_stages == 4 and plan.micro_batch_size == 64
    assert plan.stages[0].strategy(0) == LayerStrategy(dp=2)
    assert bipartition_plan().stages[0].backward == LayerRange(0, 8)
    # membership answers as iterating would (the memory model's per-layer test)
    layers = LayerRange(2, 5)
    for item in (1, 2, 4, 5, 3.0, 3.5, True, "3"):
        assert (item in layers) == (item in list(layers)), item


def _broken(edit) -> str:
    data = plan_to_dict(csimd_plan())
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize("edit,message", [
    (lambda d: d["stages"][1].update(layers=[21, 35]), "stages[1].layers: layers 20..20 not covered"),
    (lambda d: d["stages"][2].update(layers=[35, 49]), "stages[2].layers: layers 49..49 not covered"),
    (lambda d: d["stages"][1].update(layers=[18, 35]), "stages[1].layers: starts at layer 18, overlapping"),
    (lambda d: d["stages"][1].update(layers=[20, 20]), "stages[1].layers: stage has no layers"),
    (lambda d: d["stages"][2].update(devices=[0]), "stages[2].devices: device 0 used twice (also in stages[0])"),
    (lambda d: d["stages"][0].update(devices=[]), "stages[0].devices: a stage needs at least one device"),
    (lambda d: d["stages"][0].update(devices="0"), "stages[0].devices: expected a list"),
    (lambda d: d.update(format_version=3), "format_version: expected 1 or 2, got 3"),
    (lambda d: d.update(format_version=True), "format_version: expected 1 or 2, got True"),
    (lambda d: d["schedule"].update(kind="zigzag"), "schedule: unknown 'zigzag'"),
    (lambda d: d.update(schedule="1f1b"), "schedule: expected the record {kind, virtual_stages"),
    (lambda d: d["schedule"].update(virtual_stages=2), "schedule.virtual_stages: 3 stages do not split into 2 chunks"),
    (lambda d: d["schedule"].update(virtual_stages=3), "schedule: gpipe runs one chunk per rank (virtual_stages 1), got 3"),
    (lambda d: d["schedule"].update(kind="zbv", virtual_stages=3), "schedule: zbv runs exactly 2 chunks per rank"),
    (lambda d: d["schedule"].update(kind="interleaved-1f1b", virtual_stages=3),
     "stages[1].devices: the stage runs on pipeline rank 0, whose devices are [0], got [1]"),
    (lambda d: d["schedule"].update(stage_ranks=[0, 0, 1]), "schedule.stage_ranks: gpipe places stage i on rank [0, 1, 2][i]"),
    (lambda d: d["schedule"].update(stage_ranks=["a"]), "schedule.stage_ranks: expected a list of pipeline ranks"),
    (lambda d: d["schedule"].update(actions=[["F0.0"], ["B0.0"], []]), "schedule.actions: a per-rank order"),
    (lambda d: d["schedule"].update(actions=[[1]]), "schedule.actions: expected one list of action names"),
    (lambda d: d.update(precision="int4"), "precision: unknown 'int4'; expected one of fp32, tf32, bf16, fp16, fp8"),
    (lambda d: d["stages"][0].update(strategies=[{"recompute": "some"}] * 20),
     "stages[0].strategies[0].recompute: unknown 'some'; expected one of none, selective, full"),
    (lambda d: d["stages"][0].update(strategies=[{"checkpoint": True}] * 20),
     "stages[0].strategies[0].checkpoint: version 2 says recompute"),
    (lambda d: d["stages"][0].update(strategies=[{"zero": 1}] * 20),
     "stages[0].strategies[0].zero: ZeRO-1 shards over the dp replicas, and dp is 1"),
    (lambda d: d["stages"][0].update(strategies=[{"zero": 3}] * 20),
     "stages[0].strategies[0].zero: expected one of 0, 1, 2 (ZeRO-3 is the sdp degree)"),
    (lambda d: d["stages"][0].update(strategies=[{"sequence_parallel": True}] * 20),
     "stages[0].strategies[0].sequence_parallel: splits over the tp ranks, and tp is 1"),
    (lambda d: d["stages"][0].update(strategies=[{"cp": 2}] * 20), "dp*sdp*tp*cp = 2 but the stage has 1 devices"),
    (lambda d: d.update(grad_sync="sometimes"), "grad_sync: unknown 'sometimes'"),
    (lambda d: d.update(n_micro=7), "n_micro: 7 micro-batches do not divide the global batch 64"),
    (lambda d: d.update(global_batch=0), "global_batch: must be at least 1"),
    (lambda d: d.update(n_micro="8"), "n_micro: expected an integer"),
    (lambda d: d.pop("model"), "model: missing"),
    (lambda d: d["stages"][0].update(strategies=[{"dp": 2}] * 20), "dp*sdp*tp*cp = 2 but the stage has 1 devices"),
    (lambda d: d["stages"][0].update(strategies=[{"dp": 1}] * 3), "stages[0].strategies: 3 strategies for 20 layers"),
    (lambda d: d["stages"][0].update(backward_layers=[0, 10]), "stages[1].backward_layers: missing"),
    (lambda d: d.update(stages=[], schedule={"kind": "gpipe"}), "stages: schedule 'gpipe' needs at least one stage"),
    (lambda d: d.update(prediction={"iteration_s": 1, "throughput_samples_per_s": 2,
                                    "memory": [{"device": 5, "peak_bytes": 1, "capacity_bytes": 2}]}),
     "prediction.memory[0].device: device 5 is not used"),
])
def test_malformed_plans_name_the_field(edit, message):
    with pytest.raises(PlanError) as info:
        plan_from_json(_broken(edit), origin="p.json")
    text = str(info.value)
    assert text.startswith("p.json: ") and message in text, text
    assert "\n" not in text


def test_operator_plans_are_checked():
    from dataclasses import replace

    plan = fddps_plan()
    with pytest.raises(PlanError, match="operator 'fc' also placed"):
        validate(replace(plan, operators=plan.operators + (OperatorPlacement(2, ("fc",)),)))
    with pytest.raises(PlanError, match="device 0 listed twice"):
        validate(replace(plan, operators=plan.operators + (OperatorPlacement(0, ("x",)),)))
    with pytest.raises(PlanError, match="needs an operator placement"):
        validate(replace(plan, operators=()))


def test_bipartition_backward_ranges_must_cover_the_model():
    from dataclasses import replace

    plan = bipartition_plan()
    bad = replace(plan, stages=(plan.stages[0], replace(plan.stages[1], backward_layers=LayerRange(9, 16))))
    with pytest.raises(PlanError, match=r"stages\[1\].backward_layers: layers 8..8 not covered"):
        validate(bad)


def test_micro_batch_must_split_across_data_parallel_devices():
    from dataclasses import replace

    plan = gropipe_plan()
    with pytest.raises(PlanError, match="does not split 2 ways"):
        validate(replace(plan, global_batch=12, n_micro=12))


def test_check_fits_the_world():
    plan = csimd_plan()
    check_fits(plan, n_layers=50, n_devices=8)
    with pytest.raises(PlanError, match="the model has 48"):
        check_fits(plan, n_layers=48, n_devices=8)
    with pytest.raises(PlanError, match="uses device 2 but tiny has 2"):
        check_fits(plan, n_layers=50, n_devices=2, cluster_name="tiny")


def test_malformed_json_and_missing_file(tmp_path):
    with pytest.raises(PlanError, match="malformed JSON"):
        plan_from_json("{not json", "x.json")
    with pytest.raises(PlanError, match="cannot read plan"):
        read_plan(tmp_path / "nope.json")


def test_invalid_plan_is_never_written(tmp_path):
    from dataclasses import replace

    path = tmp_path / "plan.json"
    with pytest.raises(PlanError):
        write_plan(replace(csimd_plan(), n_micro=7), path)
    assert not path.exists() and list(tmp_path.iterdir()) == []
