"""Megatron-LM's expert-parallel all-to-all overlap (issue 50 item 2, plans/expert_overlap.py): a plan
choice under megatron-core 0.16.1's own rule, priced by the simulator as combined passes in 1F1B's
steady state (against the closed form of costs/axis_costs.py `overlap_saving`), kept by the plan file,
searched by the Megatron grid for Megatron-LM only, and refused in one line by what cannot run it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from paraplan.costs.axis_costs import overlap_saving
from paraplan.costs.expert_costs import expert_share
from paraplan.costs.strategy import layer_time_on, strategy_links
from paraplan.planners.galvatron.grid import grid_candidates
from paraplan.planners.registry import simulator_judge
from paraplan.plans.expert_overlap import expert_overlap_problem, steady_share
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, PlanError, Stage, validate
from paraplan.plans.plan_file import plan_from_json, plan_to_json
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

# four Qwen3-30B-A3B blocks (128 experts of FFN 768, top-8), forced balance: small enough to plan in seconds
QWEN3_4 = ("hf:qwen3_moe?num_hidden_layers=4&hidden_size=2048&num_attention_heads=32&num_key_value_heads=4"
           "&head_dim=128&num_local_experts=128&moe_intermediate_size=768&num_experts_per_tok=8"
           "&vocab_size=151936&expert_imbalance=1")


def _plan(n_stages=1, virtual=1, n_micro=4, recompute="none", precision="bf16", ep=8, layers=6) -> Plan:
    """Layers 1..layers-2 MoE-shaped strategies (EP ep) over 8 devices per stage, the rest plain DP8."""
    bounds = [round(k * layers / n_stages) for k in range(n_stages + 1)]
    ranks = n_stages // virtual
    stages = tuple(Stage(LayerRange(a, b), tuple(range(8 * (i % ranks), 8 * (i % ranks) + 8)),
                         strategies=tuple(LayerStrategy(dp=8, ep=ep if 0 < j < layers - 1 else 1, recompute=recompute)
                                          for j in range(a, b)))
                   for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)))
    schedule = "interleaved-1f1b" if virtual > 1 else "1f1b"
    return Plan(model="m", cluster="c", n_layers=layers, global_batch=8 * n_micro, n_micro=n_micro, schedule=schedule,
                stages=stages, precision=precision, virtual_stages=virtual)


@pytest.mark.parametrize("kwargs, problem", [
    ({}, None),
    ({"n_stages": 4, "virtual": 2}, None),
    ({"ep": 1}, "needs expert parallelism"),
    ({"precision": "fp32"}, "bf16 or fp16"),
    ({"recompute": "full"}, "full recomputation"),
    ({"n_stages": 2}, "needs interleaving"),
])
def test_the_rule_is_megatron_cores(kwargs, problem):
    """transformer_config.py (0.16.1) __post_init__'s asserts for overlap_moe_expert_parallel_comm."""
    plan = _plan(**kwargs)
    found = expert_overlap_problem(plan)
    assert (found is None) if problem is None else (problem in found)
    if problem is None:
        assert validate(replace(plan, expert_overlap=True)).expert_overlap
    else:
        with pytest.raises(PlanError, match="schedule.expert_overlap"):
            validate(replace(plan, expert_overlap=True))


def test_the_steady_share_is_megatrons_warm_up():
    """Megatron's interleaved warm-up on rank r of p with v chunks: (p - r - 1) x 2 + (v - 1) x p
    forwards of its n x v; plain 1F1B: p - r - 1; one rank: the first forward alone."""
    assert steady_share(4, 1, 1, 0) == 3 / 4
    assert steady_share(4, 2, 2, 0) == (8 - 4) / 8  # warm-up 2 + 2
    assert steady_share(4, 2, 2, 1) == (8 - 2) / 8  # warm-up 0 + 2
    assert steady_share(8, 4, 1, 0) == (8 - 3) / 8
    assert steady_share(1, 1, 1, 0) == 0.0  # one micro-batch: nothing to combine it with


@pytest.fixture(scope="module")
def qwen3():
    request = replace(workload(QWEN3_4, "dgx-h100-80gb?nodes=1", batch=64, precision="bf16", engine="megatron",
                               seq_len=4096).request, options={"expert_parallel": 8})
    return request, grid_candidates(request, simulator_judge(request))


def test_the_simulator_hides_the_closed_form(qwen3):
    """One stage of m micro-batches (the grid's fastest plan without the overlap that has several):
    m - 1 of its m forward-backward pairs combined, each MoE layer's pair saving what `overlap_saving`
    gives for its measured compute and all-to-alls."""
    request, judged = qwen3
    plan = next(p for p, pred in judged if not p.expert_overlap and p.n_micro > 1 and pred.feasible)
    assert plan.n_stages == 1 and steady_share(plan.n_micro, 1, 1, 0) == (plan.n_micro - 1) / plan.n_micro
    plan = replace(plan, precision="bf16", prediction=None)
    cm = request.costs
    stage = plan.stages[0]
    saved = 0.0
    for i in stage.layers:
        st = stage.strategy(i)
        t = layer_time_on(cm.compute(stage.devices[0]), cm.model, i, st, plan.micro_batch_size,
                          strategy_links(cm.cluster, st, stage.devices), cm.overlap_slowdown, cm.overheads,
                          cm.overheads.scale_for(8))
        saved += sum(overlap_saving(t.forward_s, t.backward_s, t.dispatch_forward_s, t.dispatch_backward_s,
                                    cm.overlap_slowdown, expert_share(cm.model.layers[i], plan.micro_batch_size / st.data_degree)))
    assert saved > 0
    without = simulate_plan(plan, cm).prediction.iteration_s
    with_overlap = simulate_plan(replace(plan, expert_overlap=True), cm).prediction.iteration_s
    assert without - with_overlap == pytest.approx(plan.n_micro * steady_share(plan.n_micro, 1, 1, 0) * saved, rel=1e-9)


def test_the_megatron_grid_judges_it_for_megatron_only(qwen3):
    request, judged = qwen3
    best, prediction = judged[0]
    assert best.expert_overlap and prediction.feasible
    plain = min(pred.iteration_s for p, pred in judged if not p.expert_overlap and pred.feasible)
    assert prediction.iteration_s < plain
    paraplan = replace(request, costs=replace(request.costs, engine="paraplan"))
    assert not any(p.expert_overlap for p, _ in grid_candidates(paraplan, simulator_judge(paraplan)))


def test_the_plan_file_keeps_it_and_old_files_load_without_it():
    plan = validate(replace(_plan(), expert_overlap=True))
    text = plan_to_json(plan)
    assert '"expert_overlap": true' in text
    assert plan_from_json(text).expert_overlap
    assert not plan_from_json(plan_to_json(_plan())).expert_overlap
    assert "expert_overlap" not in plan_to_json(_plan())


def test_train_refuses_it_in_one_line_and_simulate_says_it(tmp_path):
    """paraplan's runtime runs the all-to-alls in line: a plan with the overlap is Megatron-LM's to run."""
    from paraplan_process import refused, run_paraplan

    from paraplan.plans.plan_file import write_plan

    n = 4  # mixtral-tiny: the embedding, 2 MoE blocks, the norm and head
    moe = LayerStrategy(dp=2, ep=2)
    strategies = tuple(moe if 0 < i < n - 1 else LayerStrategy(dp=2) for i in range(n))
    plan = validate(Plan(model="mixtral-tiny", cluster="local", n_layers=n, global_batch=8, n_micro=2, schedule="1f1b",
                         stages=(Stage(LayerRange(0, n), (0, 1), strategies=strategies),), precision="bf16",
                         expert_overlap=True))
    write_plan(plan, tmp_path / "plan.json")
    refused(run_paraplan("train", "--plan", tmp_path / "plan.json", "--steps", "1", cwd=tmp_path),
            "schedule.expert_overlap", "paraplan export --to megatron")
    simulated = run_paraplan("simulate", tmp_path / "plan.json", cwd=tmp_path)
    assert simulated.returncode == 0, simulated.stderr
    assert "Megatron-LM's all-to-all overlap" in simulated.stdout
