"""Engine implementation profiles (issue 48, item 2; costs/engine_profile.py): the same plan priced
as paraplan's runtime, Megatron-LM and torchtitan run it, against closed forms."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from paraplan.costs.axis_costs import tensor_s
from paraplan.costs.engine_profile import BlockShape, LatentAttention, engine_profile, megatron_block_kernels
from paraplan.costs.strategy import layer_time
from paraplan.errors import ParaplanError
from paraplan.hardware import load_cluster
from paraplan.hardware.cluster import LinkSpec
from paraplan.plans.plan import LayerStrategy
from paraplan.workload import cost_model, measured_model

H, HEADS, FFN, SEQ = 512, 8, 2048, 256
GPT = (f"hf:gpt2?n_layer=2&n_embd={H}&n_head={HEADS}&vocab_size=1000&n_positions={SEQ}&seq_len={SEQ}")
GPT_BLOCK = BlockShape(H, HEADS, HEADS, FFN, SEQ, gated=False, dropout=True, eager_attention=True)
LINK = LinkSpec(bandwidth_bytes_per_s=100e9, latency_s=0.0)


@pytest.fixture(scope="module")
def gpt():
    spec = measured_model(GPT, precision="bf16", attention="math")[1]
    cluster = load_cluster("dgx-a100-80gb?nodes=1")
    return {engine: cost_model(spec, cluster, precision="bf16", engine=engine, block=GPT_BLOCK)
            for engine in ("paraplan", "megatron", "torchtitan")}


def test_megatron_fused_kernels_are_the_closed_form():
    """Per sample, e = 2: forward 2 norms (2eTh) + 2 bias-dropout-adds ((3e+1)Th) + bias-GeLU (2eTf)
    + the fused softmax (2e aTs) and its dropout ((2e+1) aTs)."""
    fused = megatron_block_kernels(GPT_BLOCK)
    e, t = 2, SEQ
    forward = sum(op.nbytes.per_sample * op.count for op in fused.forward.memory_ops)
    scores = HEADS * t * SEQ
    assert forward == 2 * 2 * e * t * H + 2 * (3 * e + 1) * t * H + 2 * e * t * FFN + 2 * e * scores + (2 * e + 1) * scores
    assert fused.forward.n_kernels == 7
    replicated = sum(op.nbytes.per_sample * op.count for op in fused.replicated_forward.memory_ops)
    assert replicated == 2 * 2 * e * t * H + 2 * (3 * e + 1) * t * H
    core = sum(op.nbytes.per_sample * op.count for op in fused.core_forward.memory_ops)
    assert core == 2 * e * scores + (2 * e + 1) * scores
    # Llama: RMSNorm, SwiGLU (3eTf), fused rotary on q and k (2eT(h + g h/a)), flash attention, no dropout
    llama = megatron_block_kernels(BlockShape(H, HEADS, 2, FFN, SEQ, gated=True, dropout=False, eager_attention=False))
    forward = sum(op.nbytes.per_sample * op.count for op in llama.forward.memory_ops)
    assert forward == 2 * 2 * e * t * H + 2 * 3 * e * t * H + 3 * e * t * FFN + 2 * e * t * (H + 2 * H // HEADS)


def test_latent_attention_kernels_are_the_closed_form():
    """MLA (DeepSeek-V3's widths, a = 128 heads, n / r / v = 128 / 64 / 128, q / kv ranks 1536 / 512):
    in place of the h-wide fused rotary, its rotary on the rope parts (2eT r (a + 1)), q and k each
    assembled from their parts (2eT a (n + r)) and the two compressed norms (2eT (1536 + 512));
    backward the same rotary, q's gradient assembled again, kv_b's output gradient (2eT a (n + v)),
    the shared key part's sum over the heads (eT a r), the norms' 3eT (1536 + 512)."""
    latent = LatentAttention(128, 64, 128, 1536, 512)
    h, a, t, e = 7168, 128, 4096, 2
    llama = BlockShape(h, a, a, 18432, t, gated=True, dropout=False, eager_attention=False)
    mla = megatron_block_kernels(replace(llama, latent=latent))
    plain = megatron_block_kernels(llama)

    def total(ops):
        return sum(op.nbytes.per_sample * op.count for op in ops.memory_ops)

    rotary, norms = 2 * e * t * 64 * (a + 1), 1536 + 512
    assert total(mla.forward) - total(plain.forward) == (rotary + 2 * 2 * e * t * a * 192 + 2 * e * t * norms
                                                         - 2 * e * t * 2 * h)
    assert total(mla.backward) - total(plain.backward) == (rotary + 2 * e * t * a * 192 + 2 * e * t * a * 256
                                                           + e * t * a * 64 + 3 * e * t * norms - 2 * e * t * 2 * h)
    assert total(mla.replicated_forward) - total(plain.replicated_forward) == 2 * e * t * norms


def test_collectives_and_sends_move_each_engines_dtype(gpt):
    """Autocast keeps the residual stream in fp32 (checked with a bf16 run on the CPU: a block returns
    fp32, its o_proj and down_proj bf16): paraplan's runtime sends 4 bytes per element between
    pipeline stages where Megatron and torchtitan send 2; the TP all-reduces act on the row-parallel
    linear's bf16 output in all of them, 2 bytes."""
    paraplan, megatron = gpt["paraplan"].model.layers[1], gpt["megatron"].model.layers[1]
    assert paraplan.output_bytes.per_sample == 4 * SEQ * H and paraplan.output_element_bytes == 4
    assert megatron.output_bytes.per_sample == 2 * SEQ * H and megatron.output_element_bytes == 2
    assert gpt["torchtitan"].model.layers[1].output_bytes == megatron.output_bytes
    tp = LayerStrategy(tp=4)
    two_bytes = tensor_s(megatron, 2.0, tp, LINK, 2)[0]
    assert tensor_s(paraplan, 2.0, tp, LINK, 2)[0] == pytest.approx(two_bytes)
    assert tensor_s(paraplan, 2.0, tp, LINK)[0] == pytest.approx(2 * two_bytes)  # what fp32 would cost


def test_a_plan_priced_for_two_engines_differs_by_kernels_and_overlap(gpt):
    """Megatron's fused kernels take less time than the eager module's; its norms and residual adds
    run whole on every TP rank without SP; torchtitan's FSDP2 prefetch hides the forward's gather."""
    costs = {k: v.compute(0) for k, v in gpt.items()}
    assert costs["megatron"].forward[1](2.0) < costs["paraplan"].forward[1](2.0)
    fn = costs["megatron"].forward[1]
    model = gpt["megatron"].model
    no_sp = layer_time(costs["megatron"], model, 1, LayerStrategy(tp=4), 2.0, LINK, LINK).forward_s
    sp = layer_time(costs["megatron"], model, 1, LayerStrategy(tp=4, sequence_parallel=True), 2.0, LINK, LINK).forward_s
    assert no_sp - sp == pytest.approx(fn.replicated_s(2.0) * (1 - 1 / 4), rel=1e-9)
    sdp = LayerStrategy(sdp=8)
    slow = LinkSpec(bandwidth_bytes_per_s=1e9, latency_s=0.0)
    eager = layer_time(costs["paraplan"], gpt["paraplan"].model, 1, sdp, 2.0, slow, slow)
    prefetched = layer_time(costs["torchtitan"], gpt["torchtitan"].model, 1, sdp, 2.0, slow, slow)
    local = 2.0 / 8  # each FSDP rank computes its share of the micro-batch
    gather = eager.forward_s - costs["paraplan"].forward[1](local)
    assert gather > 0
    # the gather runs beside the compute: the forward takes the longer of the two
    assert prefetched.forward_s == pytest.approx(max(costs["torchtitan"].forward[1](local), gather), rel=1e-9)


def test_selective_recomputation_is_what_each_engine_runs_again(gpt):
    """Megatron's selective recomputes the attention core (its batched GEMMs, the softmax and its
    dropout); torchtitan's per-operator policy half the matmuls and every memory-bound kernel."""
    costs = {k: v.compute(0) for k, v in gpt.items()}
    megatron = costs["megatron"].forward[1]
    assert 0 < megatron.selective_s(2.0) < 0.6 * megatron(2.0)
    titan = costs["torchtitan"].forward[1]
    assert 0.3 * titan(2.0) < titan.selective_s(2.0) < titan(2.0)
    assert costs["paraplan"].forward[1].selective_s(2.0) is None  # the FLOP share, as before


def test_unknown_engine_is_one_line():
    with pytest.raises(ParaplanError, match="unknown engine 'titan'"):
        engine_profile("titan")


def test_torchtitan_8_to_128_gpus_within_5_points():
    """torchtitan Tables 1 and 3 (benchmarks/published_runs_today.py): FSDP 8 -> 128 lost 2.7% of
    tokens/s per GPU; FSDP2's prefetch and the rails keep the predicted change within 5 points
    (it was 27.5% with the gathers in series and one port per node)."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs_today.py"
    spec = importlib.util.spec_from_file_location("published_runs_today", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs_today"] = module
    spec.loader.exec_module(module)
    eight, many = (module.predict(run) for run in module.RUNS[:2])
    published = 5605 / 5762 - 1
    predicted = many["tokens_per_gpu_s"] / eight["tokens_per_gpu_s"] - 1
    assert abs(predicted - published) <= 0.05
    # and each within 15% of the published time (not fitted: datasheets and publications only), time
    # as the issues and benchmarks/published_runs.py count it (tokens/s published over predicted). Both
    # predicted faster (12% and 14% since each layer's backward is measured on its own, models/measure.py;
    # 8% and 10% before, when the backward's inflated memory traffic hid it): the source's 500 W cap
    # on its H100s is not modelled (benchmarks/published_runs_today.py)
    for row, tokens in ((eight, 5762), (many, 5605)):
        assert tokens / row["tokens_per_gpu_s"] == pytest.approx(1.0, abs=0.15)
    # and their memory within 15% (82.4 and 67.0 GiB: the loss's gradients at the loss's backward)
    assert eight["peak_gib"] == pytest.approx(82.4, rel=0.15) and many["peak_gib"] == pytest.approx(67.0, rel=0.15)


def test_plan_files_record_the_engine_and_old_files_load_as_paraplan(tmp_path):
    """A prediction priced for an engine says so in the plan file; a file without the key (every file
    written before issue 48) was priced as paraplan's runtime runs it; an unknown engine is refused."""
    from dataclasses import replace as dc_replace

    from paraplan.costs.engine_profile import ENGINES
    from paraplan.plans.plan_file import plan_from_json, plan_to_json, read_plan
    from paraplan.plans.prediction import PRICED_BY

    assert ENGINES == PRICED_BY
    root = Path(__file__).resolve().parents[2]
    old = read_plan(root / "examples" / "resnet-50-fddps-8xp100.json")
    assert old.prediction is not None and old.prediction.engine == "paraplan"
    assert '"engine"' not in plan_to_json(old)
    priced = dc_replace(old, prediction=dc_replace(old.prediction, engine="megatron"))
    assert plan_from_json(plan_to_json(priced)).prediction.engine == "megatron"
    text = plan_to_json(priced).replace('"megatron"', '"titan"')
    with pytest.raises(ParaplanError, match="prediction.engine: unknown engine 'titan'"):
        plan_from_json(text)


def test_engine_activations_are_korthikantis_on_a_gpt_and_a_llama_shape(gpt):
    """Megatron keeps Korthikanti et al. 2022's 34 s b h + 5 a s^2 b bytes per GPT layer (their §4.1,
    plus the norms' fp32 statistics they leave out: 2 x 8 s b); selective recomputation drops the
    5 a s^2 b. A Llama block (GQA, SwiGLU, RMSNorm, flash attention, no dropout), tensor by tensor:
    norm inputs 2 x 2sh, QKV input 2sh, Q and K 2sh(1 + g/a), V 2sh g/a, SDPA output 2sh and its
    fp32 log-sum-exp 4as, output-projection input 2sh, MLP input 2sh, four SwiGLU tensors 8sf,
    RMSNorm's rstd 2 x 4s."""
    from paraplan.costs.engine_memory import engine_activations, torchtitan_op_sac_bytes
    from paraplan.costs.engine_profile import PROFILES

    s, h, a = SEQ, H, HEADS
    block = gpt["megatron"].model.layers[1]
    assert block.saved_bytes.per_sample == 34 * s * h + 5 * a * s * s + 2 * 8 * s
    assert block.attention_core_bytes.per_sample == 5 * a * s * s
    g, f = 2, FFN
    llama = BlockShape(h, a, g, f, s, gated=True, dropout=False, eager_attention=False)
    spec = measured_model("hf:llama?hidden_size=512&intermediate_size=2048&num_hidden_layers=1&num_attention_heads=8"
                          "&num_key_value_heads=2&vocab_size=1000&seq_len=256", precision="bf16", attention="fused")[1]
    kept = engine_activations(spec, llama, PROFILES["megatron"]).layers[1].saved_bytes.per_sample
    assert kept == (4 * s * h + 2 * s * h + 2 * s * h * (1 + g / a) + 2 * s * h * g / a + 2 * s * h + 4 * a * s
                    + 2 * s * h + 2 * s * h + 8 * s * f + 2 * 4 * s)
    # torchtitan's per-operator SAC: q, v, the gate, w2's output, SDPA's output, the block input
    assert torchtitan_op_sac_bytes(llama) == 2 * s * (h + h * g // a + f + h + h + h) + 4 * a * s
    titan = engine_activations(spec, llama, PROFILES["torchtitan"]).layers[1]
    assert titan.saved_bytes.per_sample - titan.attention_core_bytes.per_sample == torchtitan_op_sac_bytes(llama)


def test_torchtitan_table_5_orderings_on_the_rank_it_logs():
    """torchtitan Table 5 (Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, 8 micro-batches): interleaved 1F1B
    ran 1.28x faster than 1F1B and used 11.9% less memory on the rank torchtitan logs (the first of
    the last pipeline stage). Both orderings follow from the schedules and from FSDP's units kept
    per stage under pipelining (costs/memory.py); neither was set on the row."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs_today.py"
    spec = importlib.util.spec_from_file_location("published_runs_today", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["published_runs_today"] = module
    spec.loader.exec_module(module)
    orderings = module.table_5_orderings()
    assert orderings["time_ordering_right"] and orderings["memory_ordering_right"], orderings
