"""Issue 50 item 2: the expert view's cost terms (costs/expert_costs.py) against their closed forms:
the dispatch and combine all-to-alls inside a node and across nodes, the expert states per device
of Megatron's corrected estimator (NVIDIA/Megatron-LM PR #4687) for two layouts, the imbalance on
the busiest rank, and the routed experts' gradient sync over their own replicas."""

from __future__ import annotations

import pytest

from paraplan.costs.expert_costs import all_to_all_link, dispatch_s, expert_groups, expert_sync
from paraplan.costs.memory_config import MemoryConfig
from paraplan.costs.model import analytic_cost_model
from paraplan.costs.strategy import layer_memory, layer_time_on, strategy_links
from paraplan.hardware import load_cluster
from paraplan.models import measure, source
from paraplan.plans.axes import EXPERT, EXPERT_DATA, EXPERT_TENSOR
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, PlanError, Stage, validate

H, F, E, K, SEQ = 256, 512, 16, 4, 128
MOE = (f"hf:mixtral?num_hidden_layers=2&hidden_size={H}&intermediate_size={F}&num_attention_heads=4"
       f"&num_key_value_heads=4&num_local_experts={E}&num_experts_per_tok={K}&vocab_size=512&seq_len={SEQ}")


@pytest.fixture(scope="module")
def model():
    spec = measure.measure(source.build(MOE, device="meta"), precision="bf16")
    return spec.in_compute_dtype(2)


def _block(model):
    return next(i for i, layer in enumerate(model.layers) if layer.experts is not None)


def test_the_all_to_all_inside_a_node_moves_t_k_h_bytes_less_its_own_share_over_nvlink(model):
    cluster = load_cluster("dgx-h100-80gb?nodes=1")
    i, st = _block(model), LayerStrategy(dp=8, ep=8)
    links = strategy_links(cluster, st, tuple(range(8)))
    nvlink = cluster.nodes[0].intra_link
    local = 2  # samples on this device: a micro-batch of 16 over dp 8
    volume = local * SEQ * K * H * 2  # T k h bytes, bf16
    one = (8 - 1) / 8 * volume / nvlink.bandwidth_bytes_per_s + links[EXPERT].latency_s
    forward, backward = dispatch_s(model.layers[i], local, st, links, 2)
    assert forward == pytest.approx(2 * one) and backward == pytest.approx(2 * one)  # dispatch + combine
    assert links[EXPERT].bandwidth_bytes_per_s == pytest.approx(nvlink.bandwidth_bytes_per_s)


def test_across_two_nodes_the_peers_outside_the_node_go_over_its_rails_at_once_with_the_rest(model):
    cluster = load_cluster("dgx-h100-80gb?nodes=2")
    group = tuple(range(16))
    node = cluster.nodes[0]
    link = all_to_all_link(cluster, group)
    # each device sends 1/16 of its bytes to each peer: 7 inside its node over NVLink, 8 outside over
    # the node's rails, which its 8 devices share (min(8, rails) ports for 8 senders)
    intra = 7 / 16 / node.intra_link.bandwidth_bytes_per_s
    inter = 8 / 16 / (node.network.bandwidth_bytes_per_s * min(8, node.rails) / 8)
    volume = 1e9
    assert (15 / 16) * volume / link.bandwidth_bytes_per_s == pytest.approx(max(intra, inter) * volume)
    assert inter > intra  # the network bounds it
    # the layer's dispatch on EP16 prices on that link; on EP8 it stays inside the node
    i, local = _block(model), 1
    st16, st8 = LayerStrategy(dp=16, ep=16), LayerStrategy(dp=16, ep=8)
    f16, _ = dispatch_s(model.layers[i], local, st16, strategy_links(cluster, st16, group), 2)
    f8, _ = dispatch_s(model.layers[i], local, st8, strategy_links(cluster, st8, group), 2)
    assert f16 > f8
    assert expert_groups(st8, group)[EXPERT] == tuple(range(8))
    assert expert_groups(st8, group)[EXPERT_DATA] == (0, 8)


def test_expert_tensor_parallelism_gathers_and_scatters_the_routed_tokens_over_its_ranks(model):
    cluster = load_cluster("dgx-h100-80gb?nodes=1")
    i, local = _block(model), 4
    st = LayerStrategy(dp=4, tp=2, sequence_parallel=True, ep=4, etp=2)
    links = strategy_links(cluster, st, tuple(range(8)))
    assert expert_groups(st, tuple(range(8)))[EXPERT_TENSOR] == (0, 1)
    assert expert_groups(st, tuple(range(8)))[EXPERT] == (0, 2, 4, 6)
    volume = local * SEQ / 2 * K * H * 2  # sequence parallelism: each tp rank dispatches half the tokens
    bw, lat = links[EXPERT].bandwidth_bytes_per_s, links[EXPERT].latency_s
    etp = links[EXPERT_TENSOR]
    gathered = 2 * volume
    expected = 2 * (3 / 4 * volume / bw + lat) + 2 * (gathered / 2 / etp.bandwidth_bytes_per_s + etp.latency_s)
    assert dispatch_s(model.layers[i], local, st, links, 2)[0] == pytest.approx(expected)


@pytest.mark.parametrize("ep, expected_edp", [(8, 1), (2, 4)])
def test_expert_states_per_device_are_megatrons_corrected_estimate(model, ep, expected_edp):
    """Megatron's distributed optimizer in bf16 (2-byte parameters, 4-byte main gradients, 12 bytes
    of fp32 master weights and Adam moments over the replicas): routed parameters / (EP x ETP) at
    6 + 12 / EDP bytes each; the dense part at 6 + 12 / DP over tp."""
    config = MemoryConfig().for_precision("bf16").for_engine("megatron", "bf16")
    i = _block(model)
    layer = model.layers[i]
    routed = E * 3 * H * F
    assert layer.experts.routed_params == routed
    st = LayerStrategy(dp=8, zero=1, ep=ep)
    m = layer_memory(model, i, st, 8.0, config)
    dense = layer.param_count - routed
    expected = routed / ep * (6 + 12 / expected_edp) + dense * (6 + 12 / 8)
    assert m.states_bytes == pytest.approx(expected)
    # without an expert view the experts are states like the rest: every device holds them all
    whole = layer_memory(model, i, LayerStrategy(dp=8, zero=1), 8.0, config)
    assert whole.states_bytes == pytest.approx(layer.param_count * (6 + 12 / 8))


def test_with_tensor_parallelism_the_dense_part_splits_tp_ways_and_the_experts_ep_x_etp(model):
    config = MemoryConfig().for_precision("bf16").for_engine("megatron", "bf16")
    i = _block(model)
    layer = model.layers[i]
    routed = E * 3 * H * F
    st = LayerStrategy(dp=4, tp=2, sequence_parallel=True, zero=1, ep=2, etp=2)  # edp = 8 / 4 = 2
    m = layer_memory(model, i, st, 8.0, config)
    assert m.states_bytes == pytest.approx(routed / 4 * (6 + 12 / 2) + (layer.param_count - routed) / 2 * (6 + 12 / 4))


def test_the_busiest_rank_pays_the_imbalance_on_its_expert_work_only_with_ep(model):
    cluster = load_cluster("dgx-h100-80gb?nodes=1")
    balanced = measure.measure(source.build(MOE + "&expert_imbalance=1", device="meta"), precision="bf16")
    balanced = balanced.in_compute_dtype(2)
    i, devices = _block(model), tuple(range(8))
    times = {}
    for name, spec in (("real", model), ("balanced", balanced)):
        cm = analytic_cost_model(spec, cluster, precision="bf16")
        for st in (LayerStrategy(dp=8), LayerStrategy(dp=8, ep=8)):
            times[name, st.ep] = layer_time_on(cm.compute(0), spec, i, st, 8.0, strategy_links(cluster, st, devices))
    # one ep rank: every device runs all experts on its own tokens; routing balance changes nothing
    assert times["real", 1].forward_s == pytest.approx(times["balanced", 1].forward_s)
    # ep 8: the dispatch in both, and 15% more expert work on the busiest rank under real routing
    assert times["balanced", 8].forward_s > times["balanced", 1].forward_s
    assert times["real", 8].forward_s > times["balanced", 8].forward_s
    layer = model.layers[i]
    share = layer.experts.routed_flops_per_token * SEQ * 1.0 / layer.forward_flops.at(1.0)
    compute = times["balanced", 1].forward_s
    assert times["real", 8].forward_s - times["balanced", 8].forward_s == pytest.approx(0.15 * share * compute, rel=1e-6)


def test_the_routed_experts_gradients_are_summed_over_their_own_replicas(model):
    i = _block(model)
    layer = model.layers[i]
    routed_bytes = E * 3 * H * F * layer.param_bytes / layer.param_count
    assert expert_sync(layer, LayerStrategy(dp=8, ep=2)) == (pytest.approx(routed_bytes / 2), 4)
    assert expert_sync(layer, LayerStrategy(dp=8, ep=8)) == (0.0, 1)  # one replica: nothing to sum
    assert expert_sync(layer, LayerStrategy(sdp=8, ep=2)) == (0.0, 1)  # FSDP reduce-scatters in the backward
    assert expert_sync(layer, LayerStrategy(dp=8)) == (0.0, 1)  # the dense view's sync holds them


def test_a_plan_file_keeps_the_expert_layout_and_validation_refuses_what_is_not_modelled():
    from paraplan.plans.plan_file import plan_from_json, plan_to_json

    def plan(st):
        return Plan(model="m", cluster="c", n_layers=1, global_batch=8, n_micro=1, schedule="gpipe",
                    stages=(Stage(LayerRange(0, 1), tuple(range(8)), strategies=(st,)),))

    st = LayerStrategy(dp=4, tp=2, sequence_parallel=True, ep=4, etp=2)
    assert plan_from_json(plan_to_json(validate(plan(st)))).stages[0].strategies[0] == st
    assert "ep" not in plan_to_json(plan(LayerStrategy(dp=8)))
    with pytest.raises(PlanError, match="needs sequence_parallel"):
        validate(plan(LayerStrategy(dp=4, tp=2, ep=4)))
    with pytest.raises(PlanError, match="does not divide"):
        validate(plan(LayerStrategy(dp=8, ep=16)))


def test_qwen3s_experts_are_not_few_tokens_each_for_the_gemm_model():
    """docs/published-runs.md (the Qwen3-30B-A3B miss): at Automodel's layout (FSDP8 x EP8, MBS 4,
    seq 4096, 128 experts of FFN 768, top-8) each of a device's 16 experts gets 8,192 tokens a
    micro-batch, balanced, and the tile-and-wave GEMM model prices that grouped GEMM within 3% of the
    shape the static-routing measurement records (8 GEMMs of all 16,384 tokens)."""
    from paraplan.costs.op_roofline import gemm_seconds
    from paraplan.hardware import load_cluster

    h100 = load_cluster("dgx-h100-80gb").devices[0].spec
    hidden, ffn, experts, top_k, ep, tokens = 2048, 768, 128, 8, 8, 4 * 4096
    per_expert = tokens * top_k * ep // experts
    assert per_expert == 8192
    for n, k in ((2 * ffn, hidden), (hidden, ffn)):  # gate and up together, then down
        measured_shape = top_k * gemm_seconds(1, tokens, n, k, 2, h100)
        grouped = gemm_seconds(experts // ep, per_expert, n, k, 2, h100)
        assert float(grouped / measured_shape) == pytest.approx(1.0, abs=0.03)
