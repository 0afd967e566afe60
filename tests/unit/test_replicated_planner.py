"""PipeDream's program with replicated stages (planners/baselines/replicated.py, issue 52 item 2):
the dynamic program against brute force over its own space (every contiguous split of the layers
and of the devices) on random small instances with devices of two speeds, and the planner on a
mixed cluster: its plan is judged by the simulator and can give stages different widths."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from paraplan.planners.baselines.replicated import replicated_dp


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield list(zip(bounds[:-1], bounds[1:], strict=True))


def _instance(rng, n_layers: int, n_units: int):
    per_layer = rng.uniform(0.5, 2.0, n_layers)
    slow = rng.uniform(1.2, 3.0)  # the later units are a slower kind
    speed = np.where(np.arange(n_units) < n_units // 2, 1.0, slow)
    fixed = rng.uniform(0.0, 0.3)  # a cost per stage that does not shrink with its width
    sent = np.concatenate(([0.0], rng.uniform(0.1, 1.5, n_layers - 1)))

    def stage(i: int, j: int, lo: int, hi: int) -> float:
        return fixed + per_layer[i:j].sum() * speed[lo:hi].max() / (hi - lo)

    def stage_s(j, lo, hi):
        return np.array([stage(i, j, lo, hi) for i in range(j)])

    def boundary_s(w, lo):
        return sent / w

    return stage, stage_s, boundary_s


@pytest.mark.parametrize("seed", range(18))
def test_the_program_finds_the_least_bottleneck_of_every_split(seed):
    rng = np.random.default_rng(seed)
    n_layers, n_units = int(rng.integers(2, 6)), int(rng.integers(1, 6))
    stage, stage_s, boundary_s = _instance(rng, n_layers, n_units)
    allowed = {1, 2, 4} if seed % 2 else set(range(1, n_units + 1))
    count = int(rng.integers(1, min(n_layers, n_units) + 1)) if seed % 3 == 0 else None  # exactly, or any
    split = replicated_dp(stage_s, boundary_s, n_layers, n_units, lambda w: w in allowed, count)[n_units - 1]
    best = np.inf
    for s in (count,) if count else range(1, min(n_layers, n_units) + 1):
        for layers in _compositions(n_layers, s):
            for units in _compositions(n_units, s):
                if any(hi - lo not in allowed for lo, hi in units):
                    continue
                worst = max(max(stage(i, j, lo, hi), boundary_s(hi - lo, lo)[i] if i else 0.0)
                            for (i, j), (lo, hi) in zip(layers, units, strict=True))
                best = min(best, worst)
    if not np.isfinite(best):
        assert split is None
        return
    assert split.bottleneck_s == pytest.approx(best)
    assert count is None or len(split.stages) == count
    # its stages cover the layers and units in order and reach the bottleneck it reports
    assert split.stages[0][0] == 0 and split.stages[-1][1] == n_layers
    assert split.stages[0][2] == 0 and split.stages[-1][3] == n_units
    worst = max(max(stage(i, j, lo, hi), boundary_s(hi - lo, lo)[i] if i else 0.0) for i, j, lo, hi in split.stages)
    assert worst == pytest.approx(split.bottleneck_s)


def test_on_a_mixed_cluster_the_plan_is_judged_and_may_widen_a_stage():
    from paraplan.planners.registry import make_plan
    from paraplan.plans.stage_widths import widths
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    w = workload("gpt2-tiny", "mixed-a100-v100", batch=32)
    plan = make_plan(w.request, "pipedream-replicated")
    assert plan.prediction.iteration_s == pytest.approx(simulate_plan(plan, w.costs).plan.prediction.iteration_s)
    assert sum(widths(plan)) <= 16 and plan.schedule in ("1f1b", "gpipe")
    # with one micro-batch on 8 devices, the program gives some stage more than one device
    one = make_plan(replace(w.request, n_micro=1), "pipedream-replicated")
    assert max(widths(one)) > 1


def test_a_faster_replica_takes_more_of_the_batch_and_the_step_is_shorter():
    """Issue 52 item 3 on the A100 + V100 preset: GPT-2 large, batch 512, data parallel over all 16
    devices. Even rows leave the A100s idle while the V100s compute (busy 98 against 200 ms, 2026-11-29);
    rows by each device's speed (about 43:21) balance them and shorten the step (705 -> 659 ms)."""
    from paraplan.planners.stage_shares import speed_shares
    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    w = workload("gpt2-large", "mixed-a100-v100", batch=512)
    n = w.costs.model.n_layers
    even = Plan(model="gpt2-large", cluster="mixed-a100-v100", n_layers=n, global_batch=512, n_micro=1,
                schedule="gpipe", grad_sync="after-backward", precision=w.costs.precision,
                stages=(Stage(LayerRange(0, n), tuple(range(16))),))
    shared = speed_shares(w.request, even)
    a100, v100 = shared.stages[0].shares[0], shared.stages[0].shares[8]
    assert a100 > v100 and len(set(shared.stages[0].shares[:8])) == 1 == len(set(shared.stages[0].shares[8:]))
    before, after = simulate_plan(even, w.costs), simulate_plan(shared, w.costs)
    assert after.plan.prediction.iteration_s < before.plan.prediction.iteration_s
    spread = [max(d.busy_s for d in s.devices) - min(d.busy_s for d in s.devices) for s in (before, after)]
    assert spread[1] < spread[0] / 2


def test_gropipes_groups_of_different_speeds_share_the_batch_by_speed():
    """GroPipe on the A100 + V100 preset (GPT-2 XL, batch 256), 2 groups x 8 stages: a stage's groups
    are an A100 and a V100, and each shape is judged again with each group's rows by its speed; the
    plan chosen shares its micro-batches (11:5) and beats every plan of even rows GroPipe judged (465
    against 559 ms, 2026-11-29). Its whole search now picks one group of 16 stages (324 ms), where
    there is nothing to share: since each layer's backward is measured on its own (models/measure.py)
    it is 2.5x cheaper at micro-batch 16, and pipelines gained on data parallelism."""
    from paraplan.planners.gropipe.planner import plan_gropipe
    from paraplan.planners.registry import simulator_judge
    from paraplan.workload import workload

    w = workload("gpt2-xl", "mixed-a100-v100", batch=256)
    plan, table = plan_gropipe(w.request, simulator_judge(w.request), shapes=[(2, 8)])
    assert all(s.shares and s.shares[0] > s.shares[1] for s in plan.stages)
    even = [r["iteration_s"] for r in table if r["feasible"] and "shares" not in r["division"]]
    assert plan.prediction.feasible and plan.prediction.iteration_s < min(even)
