"""Issue 50 item 3: the expert layout is searched with the rest. On small cases the megatron-grid
planner (whose plans Galvatron-Base and -BMW also choose among) finds the plan a brute force over
(pp, tp, ep, etp, edp, ZeRO, recomputation, micro-batches) finds, every candidate judged by the
simulator; with a memory budget that rules out the unlimited winner, the winner lays its experts out
over ep ranks; and Galvatron's own dynamic program allows expert layouts on MoE layers only."""

from __future__ import annotations

import itertools

import pytest

from paraplan.planners.galvatron.grid import grid_candidates, uniform_plan
from paraplan.planners.registry import make_plan, simulator_judge
from paraplan.plans.plan import PlanError, validate
from paraplan.workload import workload

MOE = ("hf:mixtral?num_hidden_layers=4&hidden_size=512&intermediate_size=1024&num_attention_heads=8"
       "&num_key_value_heads=8&num_local_experts=16&num_experts_per_tok=2&vocab_size=2048&seq_len=512")
CLUSTER = "dgx-h100-80gb?nodes=1"
BATCH = 16


def _brute_force(request, judge):
    """Every uniform layout of 8 devices: pp x tp x dp = 8, ep x etp dividing the stage's group (etp
    1 or tp), plain DP or ZeRO-1 replicas, each recomputation, every micro-batch count; invalid ones
    (plans/plan.py) skipped. (best feasible, or None; how many were judged)."""
    best, judged = None, 0
    for pp, tp, ep, etp_is_tp, zero, recompute, n_micro in itertools.product(
            (1, 2, 4), (1, 2, 4, 8), (1, 2, 4, 8), (False, True), (0, 1), ("none", "selective", "full"),
            [m for m in range(1, BATCH + 1) if BATCH % m == 0]):
        group = 8 // pp
        etp = tp if etp_is_tp else 1
        if tp > group or (etp_is_tp and tp == 1) or (ep == 1 and etp > 1) or group % (ep * etp):
            continue
        if (pp > 1 and n_micro < pp) or (BATCH // n_micro) % (group // tp):
            continue
        try:
            plan = validate(uniform_plan(request, pp, tp, zero, recompute, n_micro, experts=(ep, etp)))
        except PlanError:
            continue
        p = judge(plan)
        judged += 1
        if p.feasible and (best is None or p.iteration_s < best[1].iteration_s):
            best = (plan, p)
    return best, judged


@pytest.fixture(scope="module")
def cases():
    out = {}
    for memory in (None, "1.2GiB"):
        request = workload(MOE, CLUSTER, batch=BATCH, precision="bf16", memory=memory, schedule="1f1b").request
        judge = simulator_judge(request)
        out[memory] = (request, grid_candidates(request, judge)[0], _brute_force(request, judge))
    return out


@pytest.mark.parametrize("memory", [None, "1.2GiB"])
def test_the_grid_finds_the_brute_force_optimum_over_expert_layouts(cases, memory):
    _, (plan, prediction), ((best, best_prediction), judged) = cases[memory]
    assert judged > 200
    assert prediction.feasible
    assert prediction.iteration_s == pytest.approx(best_prediction.iteration_s, rel=1e-9), (plan.stages, best.stages)


def test_a_tight_budget_rules_out_the_unlimited_winner_and_the_winner_shards_its_experts(cases):
    _, (unlimited, unlimited_p), _ = cases[None]
    _, (tight, tight_p), _ = cases["1.2GiB"]
    assert max(m.peak_bytes for m in unlimited_p.memory) > 1.2 * 2**30  # it would not fit
    moe = [st for s in tight.stages for st in s.strategies if st.ep > 1]
    assert moe, tight.stages
    assert tight_p.iteration_s >= unlimited_p.iteration_s


def test_galvatron_lays_experts_out_on_moe_layers_only():
    request = workload(MOE, CLUSTER, batch=BATCH, precision="bf16", memory="1.2GiB").request
    plan = make_plan(request, "galvatron-bmw")
    assert plan.prediction.feasible
    layers = request.costs.model.layers
    for stage in plan.stages:
        for i in stage.layers:
            if layers[i].experts is None:
                assert stage.strategy(i).ep == 1 and stage.strategy(i).etp == 1


def test_simulate_shows_the_expert_layout_and_the_all_to_all_share_and_train_refuses_ep_without_experts(
        capsys, tmp_path):
    import json

    from conftest import run_cli_here

    out = tmp_path / "moe.json"
    res = run_cli_here(capsys, "plan", "--planner", "megatron-grid", "--model", MOE, "--cluster", CLUSTER, "--batch",
                       str(BATCH), "--precision", "bf16", "--memory", "1.2GiB", "--out", str(out))
    assert res.returncode == 0, res.stderr
    assert "experts EP" in res.stdout  # the plan's runs of one strategy name the expert view
    res = run_cli_here(capsys, "simulate", str(out), "--json")
    assert res.returncode == 0, res.stderr
    experts = json.loads(res.stdout)["experts"]
    assert experts["moe_layers"] == 4 and experts["layouts"][0]["layout"].startswith("EP")
    assert 0 < experts["all_to_all_share"] < 1
    res = run_cli_here(capsys, "simulate", str(out))
    assert any(line.startswith("experts: EP") for line in res.stdout.splitlines())
    # expert parallelism on the embedding, which has no experts: one line before any rank starts
    data = json.loads(out.read_text())
    data["stages"][0]["strategies"][0]["ep"] = 8
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    res = run_cli_here(capsys, "train", "--plan", str(bad), "--steps", "1")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert "without routed experts" in res.stderr or "has no experts" in res.stderr, res.stderr


def test_the_planner_table_says_which_planners_lay_experts_out():
    """`paraplan plan` names the compared planners without expert parallelism in one line (cli/plan_auto.py);
    which they are is the table's: the Galvatron variants that search every axis and the grid have it."""
    from paraplan.planners.registry import planner_names
    from paraplan.planners.table import PLANNERS

    planner_names()  # loads every planner
    with_ep = {name for name, spec in PLANNERS.items() if spec.expert_parallel}
    assert with_ep == {"galvatron", "galvatron-base", "galvatron-1f1b-biobj", "galvatron-bmw", "megatron-grid"}


def test_an_engines_projections_keep_experts_on_the_layers_that_have_them():
    """`plan --engine`'s projections (engines/restrict.py) put a block strategy on every layer of a
    stage: its expert view only where the layer has experts (an MoE model's comparison restricted to
    Megatron-LM ended in a traceback: ep 2 on the embedding)."""
    from paraplan.engines.restrict import projections
    from paraplan.engines.shape import model_shape
    from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage

    shape = model_shape("mixtral-tiny")
    dense, moe = LayerStrategy(dp=2, zero=1), LayerStrategy(dp=2, zero=1, ep=2)
    plan = Plan(model="mixtral-tiny", cluster="local", n_layers=4, global_batch=8, n_micro=1, schedule="gpipe",
                stages=(Stage(LayerRange(0, 4), (0, 1), strategies=(dense, moe, moe, LayerStrategy(dp=2))),))
    found = projections(plan, shape)
    assert found
    for p in found:
        layers = [p.stages[0].strategy(i) for i in range(4)]
        assert layers[0].ep == layers[3].ep == 1 and {x.ep for x in layers[1:3]} <= {1, 2}
        validate(p)
