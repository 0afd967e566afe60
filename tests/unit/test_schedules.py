"""The schedules' orders of actions (plans/schedules.py) against torch.distributed.pipelining's
schedule classes, built on stand-in stages (no process group: the classes compute every rank's
order in their constructor), and against the papers' closed forms on the simulator (bubbles)."""

import pytest
import torch.distributed.pipelining.schedules as torch_schedules

from paraplan.plans import live_peak, schedules
from paraplan.plans.schedules import Schedule

TORCH_CLASS = {
    Schedule.INTERLEAVED_1F1B: torch_schedules.ScheduleInterleaved1F1B,
    Schedule.LOOPED_BFS: torch_schedules.ScheduleLoopedBFS,
    Schedule.INTERLEAVED_ZB: torch_schedules.ScheduleInterleavedZeroBubble,
    Schedule.ZBV: torch_schedules.ScheduleZBVZeroBubble,
    Schedule.DUALPIPE_V: torch_schedules.ScheduleDualPipeV,
    Schedule.GPIPE: torch_schedules.ScheduleGPipe,
    Schedule.ONE_F_ONE_B: torch_schedules.Schedule1F1B,
}


class _StandInStage:
    """What the schedule classes read of a stage when they compute the orders."""

    def __init__(self, index: int, n_stages: int, n_ranks: int, rank: int):
        self.stage_index, self.num_stages = index, n_stages
        self.group_size, self.group_rank = n_ranks, rank
        self.is_first, self.is_last = index == 0, index == n_stages - 1
        self.submod = None


def _torch_orders(kind: str, n_ranks: int, virtual: int, n_micro: int) -> list[list[str]]:
    ranks = schedules.stage_ranks(kind, n_ranks, virtual)
    n = n_ranks * virtual
    out = []
    for r in range(n_ranks):
        stages = [_StandInStage(i, n, n_ranks, r) for i in range(n) if ranks[i] == r]
        schedule = TORCH_CLASS[kind](stages if virtual > 1 or kind in schedules.MULTI_CHUNK else stages[0], n_micro)
        order = []
        for action in schedule.pipeline_order[r]:
            if action is None:
                continue
            for a in action.sub_actions or (action,):  # DualPipeV's paired forward and backward, in order
                order.append(f"{a.stage_index}{a.computation_type.value}{a.microbatch_index}")
        out.append(order)
    return out


CASES = [(kind, p, v, m) for kind, vs in [(Schedule.INTERLEAVED_1F1B, (2, 3)), (Schedule.LOOPED_BFS, (2, 3)),
                                          (Schedule.INTERLEAVED_ZB, (1, 2, 3)), (Schedule.ZBV, (2,)),
                                          (Schedule.DUALPIPE_V, (2,))]
         for p in (2, 3, 4) for v in vs for m in (1, 2, 3, 4, 6, 8, 12)
         if not schedules.schedule_problem(kind, p, v, m)]


@pytest.mark.parametrize("kind,n_ranks,virtual,n_micro", CASES)
def test_every_ranks_order_is_torchs(kind, n_ranks, virtual, n_micro):
    ours = [[str(a) for a in order] for order in schedules.rank_orders(kind, n_ranks, virtual, n_micro)]
    assert ours == _torch_orders(kind, n_ranks, virtual, n_micro)


def test_the_cases_cover_every_multi_chunk_kind_and_ranks_up_to_four():
    # ZB-2P has no torch class (torch runs its orders: test_zb_2p_* below and tests/distributed)
    assert {c[0] for c in CASES} == set(schedules.MULTI_CHUNK) - {Schedule.ZB_2P}
    assert len(CASES) > 80


@pytest.mark.parametrize("kind", [Schedule.INTERLEAVED_1F1B, Schedule.LOOPED_BFS, Schedule.INTERLEAVED_ZB,
                                  Schedule.ZBV, Schedule.DUALPIPE_V, Schedule.ZB_2P])
def test_each_action_runs_once_and_in_dependency_order_within_a_rank(kind):
    n_ranks, n_micro = 4, 8
    virtual = 1 if kind == Schedule.ZB_2P else 2
    ranks = schedules.stage_ranks(kind, n_ranks, virtual)
    for r, order in enumerate(schedules.rank_orders(kind, n_ranks, virtual, n_micro)):
        mine = [s for s in range(n_ranks * virtual) if ranks[s] == r]
        split = kind in schedules.SPLIT_BACKWARD
        seen = set()
        for a in order:
            assert a not in seen
            seen.add(a)
            if a.computation != "F":  # a backward half after its own forward on the same stage
                assert schedules.Action(a.stage, schedules.Computation.FORWARD, a.micro) in seen
            if a.computation == "W":
                assert schedules.Action(a.stage, schedules.Computation.BACKWARD_INPUT, a.micro) in seen
        forwards = {(a.stage, a.micro) for a in order if a.computation == "F"}
        assert forwards == {(s, j) for s in mine for j in range(n_micro)}
        weights = {(a.stage, a.micro) for a in order if a.computation in ("B", "W")}
        assert weights == forwards  # every micro-batch's weights' gradients exactly once
        if not split:
            assert all(a.computation in ("F", "B") for a in order)


@pytest.mark.parametrize("n_ranks,n_micro", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 24)])
def test_zb_2p_fills_the_bubbles_within_its_memory_limit(n_ranks, n_micro):
    """ZB-2p (Qi et al. 2024 §3.1's heuristic, plans/zero_bubble_auto.py): at most 2p micro-batches'
    activations on a rank; with T_F = T_I = T_W (the handcrafted schedules' setting, §2.2) only the
    fill is left, the last rank's first forward waiting (p - 1) T_F, as ZB-H2's parallelogram (Fig. 3);
    with a heavier input pass (T_I = 2 T_F) ZB-H1 idles (p - 1)(T_F + T_I - T_W) and ZB-2p the fill."""
    orders = schedules.rank_orders(Schedule.ZB_2P, n_ranks, 1, n_micro)
    assert max(live_peak.in_flight(o) for o in orders) <= 2 * n_ranks
    f = 1.0
    ideal = n_micro * 3 * f
    assert _simulated(Schedule.ZB_2P, n_ranks, 1, n_micro, f, 2 * f, f) == pytest.approx(ideal + (n_ranks - 1) * f)
    b, w = 3 * f, f  # T_I = 2, T_W = 1
    ideal = n_micro * (f + b)
    h1 = _simulated(Schedule.INTERLEAVED_ZB, n_ranks, 1, n_micro, f, b, w)
    assert h1 == pytest.approx(ideal + (n_ranks - 1) * (f + (b - w) - w))
    assert _simulated(Schedule.ZB_2P, n_ranks, 1, n_micro, f, b, w) == pytest.approx(ideal + (n_ranks - 1) * f)
    # ZB-H2's warm-up (Fig. 3): rank r runs 2(p - 1 - r) + 1 forwards before its first input pass
    for r, order in enumerate(orders):
        first_input = next(i for i, a in enumerate(order) if a.computation == "I")
        assert first_input == min(n_micro, 2 * (n_ranks - 1 - r) + 1)


def test_the_mappings_are_the_papers():
    # Narayanan et al. 2021 Fig. 4: 4 devices, 2 chunks, device 1 holds layers' chunks 1 and 5
    assert schedules.stage_ranks(Schedule.INTERLEAVED_1F1B, 4, 2) == (0, 1, 2, 3, 0, 1, 2, 3)
    # Qi et al. 2024 Fig. 8 (ZB-V): rank 0 holds the first and the last stage
    assert schedules.stage_ranks(Schedule.ZBV, 4, 2) == (0, 1, 2, 3, 3, 2, 1, 0)


def test_problems_are_named_in_one_line():
    assert "2 chunks" in schedules.schedule_problem(Schedule.ZBV, 4, 3, 8)
    assert "rounds" in schedules.schedule_problem(Schedule.INTERLEAVED_1F1B, 4, 2, 10 + 1)
    assert "at least as many micro-batches" in schedules.schedule_problem(Schedule.DUALPIPE_V, 4, 2, 7)
    assert schedules.schedule_problem(Schedule.INTERLEAVED_1F1B, 4, 2, 10) == ""  # torch's flexible rounds


def test_plan_text_round_trips():
    a = schedules.Action(3, schedules.Computation.BACKWARD_WEIGHT, 7)
    assert a.plan_text() == "W7.3"
    assert schedules.Action.from_plan_text("W7.3") == a
    with pytest.raises(ValueError):
        schedules.Action.from_plan_text("3W7")


# ------------------------------------------------------------------ on the simulator: the papers' closed forms

def _simulated(kind, n_ranks, virtual, n_micro, forward, backward, weight):
    """The iteration of n_ranks x virtual equal stages, each pass's time per chunk given, no
    communication (the papers' bubble analyses count compute only)."""
    from paraplan.simulator.pipeline import PipelineWork, StageWork, run

    ranks = schedules.stage_ranks(kind, n_ranks, virtual)
    row = tuple(StageWork(device=ranks[s], forward_s=forward, backward_s=backward, send_forward_s=0.0,
                          send_backward_s=0.0, weight_grad_s=weight) for s in range(n_ranks * virtual))
    return run(PipelineWork(schedule=kind, n_micro=n_micro, replicas=(row,), virtual_stages=virtual)).iteration_s


@pytest.mark.parametrize("n_ranks,n_micro", [(2, 4), (3, 6), (4, 8), (4, 16), (8, 16)])
def test_bubbles_equal_the_papers_closed_forms(n_ranks, n_micro):
    f, b = 1.0, 2.0  # a whole stage's forward and backward (T_W = T_F: half the backward)
    ideal = n_micro * (f + b)
    # 1F1B: (p - 1)(f + b) (Narayanan et al. 2021 §2.2.1)
    assert _simulated(Schedule.ONE_F_ONE_B, n_ranks, 1, n_micro, f, b, 0) == pytest.approx(ideal + (n_ranks - 1) * (f + b))
    # interleaved with v chunks: the bubble shrinks v times, (p - 1)(f + b) / v (§2.2.2)
    for v in (2, 3, 4):
        got = _simulated(Schedule.INTERLEAVED_1F1B, n_ranks, v, n_micro, f / v, b / v, 0)
        assert got == pytest.approx(ideal + (n_ranks - 1) * (f + b) / v)
    # ZB-H1 (ZB-1P on one chunk): (p - 1)(T_F + T_B - T_W), T_B the input half (Qi et al. 2024 §3.1)
    got = _simulated(Schedule.INTERLEAVED_ZB, n_ranks, 1, n_micro, f, b, b / 2)
    assert got == pytest.approx(ideal + (n_ranks - 1) * (f + b / 2 - b / 2))
    # ZB-V with T_F = T_I = T_W (§6): no idle slot once a rank has started; what is left is the fill,
    # the last rank's first forward waiting for p - 1 chunk forwards, which no schedule avoids
    zbv = _simulated(Schedule.ZBV, n_ranks, 2, n_micro, f / 2, b / 2, b / 4)
    assert zbv == pytest.approx(ideal + (n_ranks - 1) * f / 2)
    if n_micro >= 2 * n_ranks:
        assert _simulated(Schedule.DUALPIPE_V, n_ranks, 2, n_micro, f / 2, b / 2, b / 4) <= ideal + (n_ranks - 1) * (f + b) / 2


@pytest.mark.parametrize("n_ranks,virtual,n_micro", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (8, 2, 16), (4, 4, 16)])
def test_the_first_ranks_activations_are_korthikantis(n_ranks, virtual, n_micro):
    """Interleaving keeps more micro-batches in flight on the first rank: p (1 + (p - 1) / (p v))
    stage-sized micro-batches (Korthikanti et al. 2022 §4.2.3), where 1F1B keeps p."""
    order = schedules.rank_order(Schedule.INTERLEAVED_1F1B, n_ranks, virtual, n_micro, 0)
    chunk = 1.0 / virtual  # each chunk holds 1/v of the rank's layers
    peak = live_peak.live_peak(order, {s: chunk for s in range(0, n_ranks * virtual, n_ranks)}).bytes
    assert peak == pytest.approx(n_ranks * (1 + (n_ranks - 1) / (n_ranks * virtual)))
    one_f_one_b = schedules.rank_order(Schedule.ONE_F_ONE_B, n_ranks, 1, n_micro, 0)
    assert live_peak.in_flight(one_f_one_b) == n_ranks


def test_a_split_backward_holds_the_activations_until_its_weights_pass():
    # ZB-H1's last rank delays each W behind p - 1 input passes: it holds p micro-batches, as 1F1B's first does
    for p in (2, 4):
        last = schedules.rank_order(Schedule.INTERLEAVED_ZB, p, 1, 2 * p, p - 1)
        assert live_peak.in_flight(last) == p
        assert live_peak.in_flight(schedules.one_f_one_b(p, 2 * p, p - 1)) == 1


# ------------------------------------------------------------------ the same pipeline under every schedule

def test_balanced_bounds_is_the_exact_linear_partition():
    import itertools

    import numpy as np

    from paraplan.planners.schedule_variants import balanced_bounds

    rng = np.random.default_rng(0)
    for _ in range(60):
        n_layers = int(rng.integers(2, 9))
        parts = int(rng.integers(1, n_layers + 1))
        seconds = rng.uniform(0.1, 5.0, n_layers)
        got = balanced_bounds(seconds, parts)
        assert got[0] == 0 and got[-1] == n_layers and all(a < b for a, b in itertools.pairwise(got))
        best = min(max(seconds[a:b].sum() for a, b in itertools.pairwise((0, *cuts, n_layers)))
                   for cuts in itertools.combinations(range(1, n_layers), parts - 1))
        assert max(seconds[a:b].sum() for a, b in itertools.pairwise(got)) == pytest.approx(best)
        # parts at their own speeds (ranks of a mixed cluster): part k's layers take row k's times
        rows = seconds[None, :] * rng.uniform(0.5, 2.0, (parts, 1))
        got = balanced_bounds(rows, parts)
        best = min(max(rows[k, a:b].sum() for k, (a, b) in enumerate(itertools.pairwise((0, *cuts, n_layers))))
                   for cuts in itertools.combinations(range(1, n_layers), parts - 1))
        assert max(rows[k, a:b].sum() for k, (a, b) in enumerate(itertools.pairwise(got))) == pytest.approx(best)
    # among cuts alike, the one each part's dynamic program finds first (as computed one end at a time
    # before the ends were taken together: these pins are that code's)
    assert balanced_bounds(np.ones(5), 2) == [0, 2, 5] and balanced_bounds(np.ones(7), 3) == [0, 2, 4, 7]
    assert balanced_bounds(np.array([1.0, 2, 1, 2, 1, 2, 1]), 4) == [0, 1, 3, 5, 7]
    assert balanced_bounds(np.r_[0.1, np.full(80, 2.0), 0.5], 44)[:8] == [0, 2, 4, 5, 6, 7, 8, 9]


def test_every_variant_of_a_pipeline_is_a_valid_plan_on_its_devices():
    from paraplan.planners.schedule_variants import DEFAULT_VARIANTS, variants
    from paraplan.plans.plan import LayerRange, Plan, Stage, validate
    from paraplan.simulator.predict import simulate_plan
    from paraplan.workload import workload

    cm = workload("vgg-tiny", "galvatron-8xtitan").costs  # 16 layers: up to 4 ranks x 4 chunks
    plan = Plan(model="vgg-tiny", cluster="galvatron-8xtitan", n_layers=16, global_batch=16, n_micro=8, schedule="1f1b",
                grad_sync="none", stages=tuple(Stage(LayerRange(4 * i, 4 * i + 4), (i,)) for i in range(4)))
    made = variants(plan, cm, DEFAULT_VARIANTS)
    assert all(v.plan is not None for v in made), [v.reason for v in made if v.plan is None]
    for v in made:
        validate(v.plan)
        assert set(v.plan.devices) == {0, 1, 2, 3} and v.plan.n_stages == 4 * v.virtual_stages
        assert simulate_plan(v.plan, cm).prediction.iteration_s > 0
    # DualPipeV needs 2p micro-batches: one line, not an exception
    short = variants(Plan(**{**plan.__dict__, "n_micro": 4}), cm, ((Schedule.DUALPIPE_V, 2),))[0]
    assert short.plan is None and "at least as many micro-batches" in short.reason


def test_simulate_compares_the_schedules_of_a_plan(capsys, tmp_path):
    from conftest import run_cli_here

    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.plans.plan_file import write_plan

    write_plan(Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="1f1b",
                    grad_sync="none", stages=(Stage(LayerRange(0, 3), (0,)), Stage(LayerRange(3, 6), (1,)))),
               tmp_path / "p.json")
    res = run_cli_here(capsys, "simulate", str(tmp_path / "p.json"), "--schedules", "1f1b,zb-h1,zbv,interleaved-1f1b:4",
                       "--gantt", str(tmp_path / "g.png"))
    assert res.returncode == 0, res.stderr
    assert "zb-h1" in res.stdout and "zbv" in res.stdout and "1f1b (this plan)" in res.stdout
    assert "cannot: 2 ranks x 4 chunks need 8 layers, the model has 6" in res.stdout
    assert (tmp_path / "g.png").stat().st_size > 10_000
    bad = run_cli_here(capsys, "simulate", str(tmp_path / "p.json"), "--schedules", "zigzag")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "unknown schedule 'zigzag'" in bad.stderr


def test_a_multi_chunk_plan_round_trips_through_its_file(tmp_path):
    from paraplan.plans.plan import LayerRange, Plan, Stage
    from paraplan.plans.plan_file import read_plan, write_plan

    plan = Plan(model="gpt2-tiny", cluster="local", n_layers=6, global_batch=8, n_micro=4, schedule="zbv",
                grad_sync="none", virtual_stages=2,
                stages=tuple(Stage(LayerRange(a, b), (d,)) for (a, b), d in
                             zip([(0, 2), (2, 3), (3, 4), (4, 6)], [0, 1, 1, 0], strict=True)))
    write_plan(plan, tmp_path / "p.json")
    back = read_plan(tmp_path / "p.json")
    assert back.schedule == "zbv" and back.virtual_stages == 2 and back.rank_of_stage == (0, 1, 1, 0)
    assert back.devices == (0, 1) and back.n_ranks == 2 and back.stages == plan.stages


def _summed_peak(order, per_micro, extra, units):
    """live_peak as first written: every stage summed at every action (the reference for its running sum)."""
    live, waiting = dict.fromkeys(per_micro, 0), dict.fromkeys(per_micro, 0)
    passes = {s: sum(1 for a in order if a.stage == s and a.computation in ("B", "W")) for s in per_micro}
    done, gathered = dict.fromkeys(per_micro, 0), dict.fromkeys(per_micro, False)
    best = live_peak.LivePeak(0.0, dict(live), dict(waiting), {s: (False, False) for s in per_micro})
    for a in order:
        s = a.stage
        live[s] += {"F": 1, "I": 0}.get(a.computation, -1)
        waiting[s] += {"I": 1, "W": -1}.get(a.computation, 0)
        done[s] += a.computation in ("B", "W")
        gathered[s] = gathered[s] or a.computation == "F"
        running = s if a.computation in ("B", "W") else None
        state = {t: (t == running or (gathered[t] and done[t] < passes[t]), t == running or 0 < done[t] < passes[t])
                 for t in live}
        held = sum(live[t] * per_micro[t] + waiting[t] * extra.get(t, 0.0) for t in live) + sum(
            units.get(t, (0.0, 0.0))[0] * state[t][0] + units.get(t, (0.0, 0.0))[1] * state[t][1] for t in live)
        if held > best.bytes:
            best = live_peak.LivePeak(held, dict(live), dict(waiting), state)
    return best


def test_the_running_peak_is_the_sum_over_stages_at_every_action():
    """live_peak keeps a running sum and sums the stages again only near the peak: the same bytes and
    the same moment (the first of the most bytes, ties included) as summing every stage at every action,
    on every multi-stage schedule with random and with tied byte counts."""
    import random

    rng = random.Random(7)
    kinds = [Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.LOOPED_BFS, Schedule.ZBV,
             Schedule.DUALPIPE_V, Schedule.ONE_F_ONE_B, Schedule.GPIPE]
    checked = 0
    for _ in range(400):
        kind, p = rng.choice(kinds), rng.choice([2, 3, 4])
        virtual = 2 if kind in (Schedule.ZBV, Schedule.DUALPIPE_V) else (
            rng.choice([2, 3]) if kind in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.LOOPED_BFS) else 1)
        n_micro = rng.choice([2, 4, 8]) * p
        order = schedules.rank_order(kind, p, virtual, n_micro, rng.randrange(p))
        stages = sorted({a.stage for a in order})

        def value():
            return rng.choice([1.0, 3.0, 0.0, rng.uniform(0, 1e10)])
        per_micro = {s: value() for s in stages}
        extra = {s: value() for s in stages} if rng.random() < 0.5 else {}
        units = {s: (value(), value()) for s in stages} if rng.random() < 0.5 else {}
        assert live_peak.live_peak(order, per_micro, extra, units) == _summed_peak(order, per_micro, extra, units)
        checked += 1
    assert checked == 400
