"""Stages of unequal width (issue 52 item 2) in the plan format and the simulator: the boundary's
hops against hand-built timelines, the general path against the replica path where widths are
equal, a real plan's hops and per-device speeds, and malformed plans refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.plans.plan import LayerRange, Plan, PlanError, Stage, validate
from paraplan.plans.stage_widths import Hop, hops, lane_rows
from paraplan.simulator import pipeline
from paraplan.simulator.pipeline import PipelineWork, StageHop, StageWork


def _work(seconds: tuple[tuple[float, float], ...], device: int) -> StageWork:
    return StageWork(device=device, forward_s=seconds[0], backward_s=seconds[1], send_forward_s=0.0,
                     send_backward_s=0.0)


def _hops(rows: int, a: int, b: int):
    return hops(lane_rows(rows, a), lane_rows(rows, b))


def test_the_rows_two_stages_share():
    assert lane_rows(8, 2) == ((0, 4), (4, 8))
    assert _hops(8, 2, 1) == (Hop(0, 0, 0, 4), Hop(1, 0, 4, 8))
    assert _hops(8, 1, 2) == (Hop(0, 0, 0, 4), Hop(0, 1, 4, 8))
    # 2 feeding 4: each sender's half goes to two receivers; 4 feeding 2 the reverse; equal: one to one
    assert _hops(8, 2, 4) == (Hop(0, 0, 0, 2), Hop(0, 1, 2, 4), Hop(1, 2, 4, 6), Hop(1, 3, 6, 8))
    assert [(h.sender, h.receiver) for h in _hops(12, 3, 2)] == [(0, 0), (1, 0), (1, 1), (2, 1)]
    assert sum(h.rows for h in _hops(12, 3, 2)) == 12
    assert _hops(6, 3, 3) == tuple(Hop(k, k, 2 * k, 2 * k + 2) for k in range(3))
    # shares: 3:1 of 8 rows is 6 and 2; fed into an even pair, the first device's 6 rows go 4 and 2
    assert lane_rows(8, 2, (3, 1)) == ((0, 6), (6, 8))
    assert hops(lane_rows(8, 2, (3, 1)), lane_rows(8, 2)) == (Hop(0, 0, 0, 4), Hop(0, 1, 4, 6), Hop(1, 1, 6, 8))


def test_two_devices_feeding_one_against_a_hand_built_timeline():
    """GPipe, 2 micro-batches. Devices 0 and 1 (stage 0) take 1 s forward, 2 s backward each; device
    2 (stage 1) 3 s and 4 s; each hop 0.5 s forward, 0.25 s back. By hand: both forwards of micro 0
    end at 1; device 2's receive channel takes device 0's half at 1-1.5 and device 1's at 1.5-2;
    micro 1's halves at 2-2.5 and 2.5-3; device 2 runs F0 2-5, F1 5-8, B0 8-12, B1 12-16; its send
    channel returns micro 0's gradient halves at 12-12.25 (to 0) and 12.25-12.5 (to 1), micro 1's at
    16-16.25 and 16.25-16.5; device 0 runs B0 12.25-14.25 and B1 16.25-18.25, device 1 B0 12.5-14.5
    and B1 16.5-18.5: 18.5 s."""
    work = PipelineWork(schedule="gpipe", n_micro=2, replicas=(),
                        lanes=((_work((1, 2), 0), _work((1, 2), 1)), (_work((3, 4), 2),)),
                        boundary_hops=((StageHop(0, 0, 0.5, 0.25), StageHop(1, 0, 0.5, 0.25)),))
    result = pipeline.run(work)
    assert result.iteration_s == pytest.approx(18.5)
    t = result.timeline
    forwards_on_2 = sorted((s, e) for s, e, d, k in zip(t.start, t.end, t.device, t.type, strict=False) if d == 2 and k == 0)
    assert forwards_on_2 == [(2, 5), (5, 8), (8, 12), (12, 16)]
    arrivals = sorted(float(e) for e, p, k in zip(t.end, t.peer, t.type, strict=False) if k == 1 and p == 2)
    assert arrivals == [1.5, 2.0, 2.5, 3.0]


def test_one_device_feeding_two_against_a_hand_built_timeline():
    """GPipe, 2 micro-batches. Device 0 takes 2 s forward, 4 s backward; devices 1 and 2 1 s and 1.5
    s; hops 0.5 s forward, 0.25 s back. By hand: device 0's send channel sends micro 0's halves at
    2-2.5 (to 1) and 2.5-3 (to 2), micro 1's at 4-4.5 and 4.5-5; device 1 runs F0 2.5-3.5, F1
    4.5-5.5, B0 5.5-7, B1 7-8.5; device 2 F0 3-4, F1 5-6, B0 6-7.5, B1 7.5-9; device 0's receive
    channel takes the gradients at 7-7.25, 7.5-7.75, 8.5-8.75 and 9-9.25; its B0 runs 7.75-11.75
    and B1 11.75-15.75: 15.75 s."""
    work = PipelineWork(schedule="gpipe", n_micro=2, replicas=(),
                        lanes=((_work((2, 4), 0),), (_work((1, 1.5), 1), _work((1, 1.5), 2))),
                        boundary_hops=((StageHop(0, 0, 0.5, 0.25), StageHop(0, 1, 0.5, 0.25)),))
    result = pipeline.run(work)
    assert result.iteration_s == pytest.approx(15.75)
    t = result.timeline
    on_0 = sorted((float(s), float(e)) for s, e, d, k in zip(t.start, t.end, t.device, t.type, strict=False) if d == 0 and k == 0)
    assert on_0 == [(0, 2), (2, 4), (7.75, 11.75), (11.75, 15.75)]


def test_the_general_path_prices_equal_widths_as_the_replicas_do():
    from paraplan.simulator.plan_work import plan_work
    from paraplan.simulator.wide_work import wide_work
    from paraplan.workload import workload

    costs = workload("gpt2-tiny", "galvatron-8xtitan").costs
    for schedule in ("gpipe", "1f1b"):
        for sync in ("after-backward", "bucketed", "gropipe-delayed", "none"):
            plan = Plan(model="gpt2-tiny", cluster="x", n_layers=6, global_batch=32, n_micro=4, schedule=schedule,
                        grad_sync=sync, stages=(Stage(LayerRange(0, 3), (0, 1)), Stage(LayerRange(3, 6), (2, 3))))
            assert pipeline.run(wide_work(plan, costs)).iteration_s == pipeline.run(plan_work(plan, costs)).iteration_s


def test_each_device_of_a_wide_stage_computes_its_rows_at_its_own_kinds_pace():
    """A stage over an A100 and a V100 (the mixed preset numbers its A100s first) feeding one A100:
    each device of the first stage takes half of every micro-batch at its own speed, and each hop
    carries half of the activation."""
    from paraplan.simulator.plan_work import plan_work
    from paraplan.workload import workload

    costs = workload("gpt2-tiny", "mixed-a100-v100").costs
    a100, v100, other = 0, 8, 1
    plan = Plan(model="gpt2-tiny", cluster="x", n_layers=6, global_batch=32, n_micro=4, schedule="1f1b",
                grad_sync="after-backward", stages=(Stage(LayerRange(0, 3), (a100, v100)), Stage(LayerRange(3, 6), (other,))))
    work = plan_work(plan, costs)
    first, second = work.lanes
    assert [w.device for w in first] == [a100, v100] and [w.device for w in second] == [other]
    scale = costs.overheads.scale_for(3)
    for w, d in zip(first, (a100, v100), strict=False):
        alone = scale * sum(float(costs.compute(d).forward[i](4.0)) for i in range(3))
        assert w.forward_s == pytest.approx(alone + costs.overheads.action_s)
    assert first[0].forward_s != first[1].forward_s  # the kinds differ in speed
    half = costs.model.layers[2].output_bytes.at(4)
    assert [h.forward_s for h in work.boundary_hops[0]] == [
        pytest.approx(costs.cluster.link(a100, other).transfer_s(half)),
        pytest.approx(costs.cluster.link(v100, other).transfer_s(half))]


@pytest.mark.parametrize("change, needle", [
    ({"stages": (Stage(LayerRange(0, 3), (0, 1), shares=(3,)), Stage(LayerRange(3, 6), (2,)))},
     "stages[0].shares: 1 shares for 2 devices"),
    ({"stages": (Stage(LayerRange(0, 3), (0, 1), shares=(2, 0)), Stage(LayerRange(3, 6), (2,)))},
     "stages[0].shares: each share must be at least 1, got [2, 0]"),
    ({"stages": (Stage(LayerRange(0, 3), (0, 1), shares=(2, 1)), Stage(LayerRange(3, 6), (2,)))},
     "stages[0].shares: a micro-batch of 4 samples does not split 2:1 into whole rows"),
    ({"schedule": "async-1f1b"}, "stages of unequal width (2, 1) run with gpipe or 1f1b, one stage per pipeline rank, "
                                 "not async-1f1b"),
    ({"global_batch": 6, "n_micro": 2}, "a micro-batch of 3 samples does not split 2 ways"),
])
def test_a_malformed_plan_of_unequal_widths_is_one_line(change, needle):
    from dataclasses import replace

    plan = Plan(model="gpt2-tiny", cluster="x", n_layers=6, global_batch=8, n_micro=2, schedule="1f1b",
                stages=(Stage(LayerRange(0, 3), (0, 1)), Stage(LayerRange(3, 6), (2,))))
    assert validate(plan) is plan
    with pytest.raises(PlanError) as err:
        validate(replace(plan, **change))
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_comparison_names_each_stages_width():
    from paraplan.planners.plan_shape import describe

    plan = Plan(model="gpt2-tiny", cluster="x", n_layers=6, global_batch=8, n_micro=2, schedule="1f1b",
                stages=(Stage(LayerRange(0, 2), (0, 1, 2, 3)), Stage(LayerRange(2, 4), (4, 5)), Stage(LayerRange(4, 6), (6,))))
    assert describe(plan) == "3 stages of 4 + 2 + 1 devices"


def test_shares_are_written_read_priced_and_held_per_device(tmp_path):
    """Issue 52 item 3: a stage whose first device takes 3/4 of every micro-batch. The file keeps the
    shares; the simulator times each device at its own rows; each device's predicted peak is its
    own rows' (the larger share holds more activations); the engines refuse it in one line."""
    from paraplan.engines.layout import ExportRefused, engine_layout
    from paraplan.plans.plan_file import read_plan, write_plan
    from paraplan.simulator.plan_work import plan_work
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    costs = workload("gpt2-tiny", "galvatron-8xtitan").costs
    plan = Plan(model="gpt2-tiny", cluster="galvatron-8xtitan", n_layers=6, global_batch=32, n_micro=2,
                schedule="1f1b", grad_sync="after-backward", stages=(Stage(LayerRange(0, 6), (0, 1), shares=(3, 1)),))
    write_plan(plan, tmp_path / "p.json")
    assert read_plan(tmp_path / "p.json").stages[0].shares == (3, 1)
    (first, second), = plan_work(plan, costs).lanes
    scale = costs.overheads.scale_for(2)
    for lane, rows in ((first, 12), (second, 4)):
        alone = scale * sum(float(costs.compute(0).forward[i](rows)) for i in range(6))
        assert lane.forward_s == pytest.approx(alone + costs.overheads.action_s)
    memory = {m.device: m.peak_bytes for m in simulate_plan(plan, costs).plan.prediction.memory}
    even = simulate_plan(replace(plan, stages=(Stage(LayerRange(0, 6), (0, 1)),)), costs).plan.prediction.memory
    assert memory[0] > even[0].peak_bytes > memory[1]
    with pytest.raises(ExportRefused, match="unequal shares"):
        engine_layout(plan, ("embedding",) + ("block",) * 4 + ("head",))
