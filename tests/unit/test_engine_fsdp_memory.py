"""FSDP2's bytes as torchtitan keeps them (issue 48, items 2 and 4): its sharded states, the layers
it gathers in bf16, and, under pipelining, each stage's units kept gathered with unsharded fp32
gradients from the stage's first pass to its last backward (torchtitan's reshard_after_forward is
off with PP; torch.distributed.pipelining syncs a stage once, at its REDUCE_GRAD)."""

from __future__ import annotations

import pytest

from paraplan.costs.memory import plan_memory, stage_memory
from paraplan.hardware import load_cluster
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.plans.schedules import stage_ranks
from paraplan.workload import cost_model, measured_model

MODEL = ("hf:llama?hidden_size=256&intermediate_size=512&num_hidden_layers=6&num_attention_heads=4"
         "&num_key_value_heads=2&vocab_size=1000&seq_len=128")  # untied embeddings: no second copy
SDP = 4


@pytest.fixture(scope="module")
def priced():
    spec = measured_model(MODEL, precision="bf16", attention="fused")[1]
    cluster = load_cluster("dgx-a100-80gb?nodes=1")
    return {engine: cost_model(spec, cluster, precision="bf16", engine=engine)
            for engine in ("paraplan", "torchtitan")}


def _plan(n_layers: int, pp: int, virtual: int = 1, n_micro: int = 4) -> Plan:
    """sdp 4 on every layer; pp x virtual stages cut as evenly as the layers allow."""
    n_stages = pp * virtual
    bounds = [n_layers * k // n_stages for k in range(n_stages + 1)]
    schedule = "interleaved-1f1b" if virtual > 1 else "1f1b" if pp > 1 else "gpipe"
    ranks = stage_ranks(schedule, pp, virtual)
    stages = tuple(Stage(LayerRange(bounds[i], bounds[i + 1]), tuple(range(ranks[i] * SDP, (ranks[i] + 1) * SDP)),
                         strategies=tuple(LayerStrategy(sdp=SDP) for _ in range(bounds[i], bounds[i + 1])))
                   for i in range(n_stages))
    return Plan(model=MODEL, cluster="dgx-a100-80gb?nodes=1", n_layers=n_layers, global_batch=SDP * n_micro,
                n_micro=n_micro, schedule=schedule, stages=stages, grad_sync="none", precision="bf16",
                virtual_stages=virtual)


def _params(model, layers) -> float:
    return sum(model.layers[i].param_bytes / 4 for i in layers)  # measured in fp32


def test_fsdp2_states_are_sharded_and_its_gathers_are_bf16(priced):
    """16 / N bytes of fp32 parameters, gradients and Adam per parameter; FSDP2 gathers the layer
    computing and the one prefetched in bf16 (2 bytes per parameter) and keeps one unsharded
    gradient of the largest layer (4 bytes)."""
    cm = priced["torchtitan"]
    model = cm.model
    plan = _plan(len(model.layers), pp=1)
    b = stage_memory(plan, model, 0, cm.memory)
    layers = range(len(model.layers))
    assert b.states_bytes == pytest.approx(16 * _params(model, layers) / SDP, rel=1e-9)
    sizes = sorted((_params(model, [i]) for i in layers), reverse=True)
    assert b.sdp_buffer_bytes == pytest.approx(2 * (sizes[0] + sizes[1]) + 4 * sizes[0], rel=1e-9)
    assert b.kept_weight_bytes == b.kept_grad_bytes == 0.0  # no pipeline: resharded after each layer


def test_pipelined_fsdp_keeps_each_stages_units_for_the_step(priced):
    """Under 1F1B with torchtitan's defaults a stage holds its gathered bf16 weights and fp32
    unsharded gradients for all its layers, in place of the per-layer buffers; paraplan's own
    runtime reshards after every layer, as without a pipeline."""
    cm = priced["torchtitan"]
    model = cm.model
    plan = _plan(len(model.layers), pp=2)
    capacities = {d: 80 * 2**30 for d in range(8)}
    _, breakdowns = plan_memory(plan, model, capacities, cm.memory)
    for b in breakdowns:
        params = _params(model, plan.stages[b.stage].layers)
        assert b.kept_weight_bytes == pytest.approx(2 * params, rel=1e-9)
        assert b.kept_grad_bytes == pytest.approx(4 * params, rel=1e-9)
        assert b.sdp_buffer_bytes == 0.0
    own = priced["paraplan"]
    _, breakdowns = plan_memory(plan, own.model, capacities, own.memory)
    assert all(b.kept_weight_bytes == b.kept_grad_bytes == 0.0 and b.sdp_buffer_bytes > 0 for b in breakdowns)


def test_interleaving_frees_a_chunks_units_before_the_next_chunks_backward(priced):
    """Interleaved 1F1B with as many micro-batches as ranks: on the last rank every backward of its
    later chunk runs before any of its earlier chunk's, and that chunk's REDUCE_GRAD frees its
    gradients and weights before the earlier chunk's gradients exist, so at no moment does the rank
    hold both chunks' gradients (torchtitan Table 5: interleaved used 11.9% less memory than 1F1B
    on the rank it logs, the last); 1F1B's single stage holds all of them."""
    cm = priced["torchtitan"]
    model = cm.model
    n = len(model.layers)
    capacities = {d: 80 * 2**30 for d in range(8)}
    plan = _plan(n, pp=2, virtual=2, n_micro=2)
    _, breakdowns = plan_memory(plan, model, capacities, cm.memory)
    last = breakdowns[-1]
    chunks = [_params(model, plan.stages[s].layers) for s in range(plan.n_stages) if plan.rank_of_stage[s] == 1]
    assert last.kept_grad_bytes in (pytest.approx(4 * chunks[0]), pytest.approx(4 * chunks[1]))
    assert last.kept_grad_bytes < 4 * sum(chunks)
