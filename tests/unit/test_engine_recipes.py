"""Issue 49: `plan --engine E` searches E's own recipes (engines/recipes.py), and the Megatron
grid's plans are plans Megatron-LM runs (its layout takes a stage of the embedding or the loss alone)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from paraplan.engines import engine_problem, export
from paraplan.engines.layout import engine_layout
from paraplan.engines.shape import shape_of
from paraplan.planners.galvatron import grid
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import workload

LLAMA_8B_16_H100 = dict(model="llama3.1-8b", cluster="dgx-h100-80gb", batch=256, precision="bf16")  # 256 x 8192 tokens


@pytest.mark.parametrize("engine", ["torchtitan", "deepspeed"])
def test_the_engine_search_beats_fsdp_with_full_recomputation_and_accumulation_by_hand(engine):
    """Llama 3.1 8B on 16 H100 at 256 sequences of 8192: with --engine E (a quick planner beside
    it, as the full comparison would take most of the suite's budget) a plan E runs is found, and
    it is at least as fast, by E's own prediction, as the recipe its users write by hand: FSDP /
    ZeRO-3 over all 16 GPUs, full activation checkpointing, 8 micro-batches of accumulation."""
    from paraplan.engines.restrict import restrict_workload
    from paraplan.planners.auto import compare

    w = workload(LLAMA_8B_16_H100["model"], LLAMA_8B_16_H100["cluster"], batch=256, precision="bf16", engine=engine)
    assert w.built.inputs.seq_len == 8192
    result = restrict_workload(compare(w.request, planners=["dp"], time_limit_s=30), engine, w)
    assert result.best is not None
    best = result.row(result.best)
    shape = shape_of(w.built, w.built.ref)
    assert engine_problem(best.plan, engine, shape) is None
    export(best.plan, engine, shape)  # and it exports
    by_hand = replace(grid.uniform_plan(w.request, 1, 1, 0, "full", 8, sharded=True), precision="bf16")
    assert by_hand.stages[0].strategies[1].sdp == 16 and by_hand.schedule == "1f1b"
    assert engine_problem(by_hand, engine, shape) is None
    hand = simulate_plan(by_hand, w.costs).prediction
    assert hand.feasible
    assert best.iteration_s <= hand.iteration_s
    assert any(r.planner == f"{engine}-recipes" and r.status == "ok" for r in result.rows)


def test_gradient_accumulation_holds_one_micro_batch_in_flight():
    """A one-stage layout with several micro-batches is 1F1B (each backward right after its
    forward): its activations are one micro-batch's, where GPipe's order held all of them."""
    w = workload(LLAMA_8B_16_H100["model"], LLAMA_8B_16_H100["cluster"], batch=256, precision="bf16",
                 engine="torchtitan")
    accumulated = replace(grid.uniform_plan(w.request, 1, 1, 0, "full", 8, sharded=True), precision="bf16")
    all_at_once = replace(accumulated, schedule="gpipe")
    one = simulate_plan(accumulated, w.costs).prediction
    held = simulate_plan(all_at_once, w.costs).prediction
    assert max(m.peak_bytes for m in one.memory) < max(m.peak_bytes for m in held.memory)


def test_every_interleaved_megatron_layout_of_a_70b_exports_even_with_a_stage_of_the_loss_alone():
    """The Megatron grid's 70B plan on 64 H100 (8 stages of TP8, interleaved up to 10 chunks: 82
    layers over 80 stages leave the head alone) was refused as "a stage without transformer blocks";
    Megatron's own layout takes such a stage ("Ettt|(tt|)*29,m|L")."""
    w = workload("llama3.1-70b", "dgx-h100-80gb?nodes=8", batch=1024, precision="bf16", engine="megatron")
    shape = shape_of(w.built, w.built.ref)
    from paraplan.planners.schedule_variants import rewrite

    base = replace(grid.uniform_plan(w.request, 8, 8, 1, "full", 16), precision="bf16")
    lonely = 0
    for v in range(2, 11):
        plan = rewrite(base, w.request.costs, "interleaved-1f1b", v)
        assert engine_problem(plan, "megatron", shape) is None, v
        lonely += min(engine_layout(plan, shape.kinds).blocks_per_stage) == 0
        doc = json.loads(export(plan, "megatron", shape).text)
        layout = doc["transformer_config"].get("pipeline_model_parallel_layout")
        if layout:  # one pattern per stage, the embedding first and the loss last, every block once
            stages = layout.split("|")
            assert len(stages) == plan.n_stages and stages[0].startswith("E") and stages[-1].endswith("L")
            assert sum(int(x.split("*")[1].rstrip("L")) for x in stages if "t*" in x) == shape.layers
    assert lonely >= 3


def test_an_engine_runs_no_recipe_it_refuses():
    """The recipes are judged only where the engine runs them: DeepSpeed's never interleave nor
    put ZeRO-2/3 under its pipeline."""
    from paraplan.engines.recipes import ENGINE_FAMILIES
    from paraplan.planners.registry import simulator_judge

    w = workload("gpt2-tiny", "dgx-a100-80gb", batch=32, precision="bf16", engine="deepspeed")
    shape = shape_of(w.built, w.built.ref)
    seen = []

    def accept(plan):
        ok = engine_problem(replace(plan, precision="bf16"), "deepspeed", shape) is None
        seen.append(ok)
        return ok

    judged = grid.grid_candidates(w.request, simulator_judge(w.request), ENGINE_FAMILIES["deepspeed"], accept,
                                  accumulation=True)
    assert judged
    for plan, _ in judged:
        assert engine_problem(replace(plan, precision="bf16"), "deepspeed", shape) is None
        assert plan.schedule != "interleaved-1f1b"
    assert False in seen  # some were refused, never judged
