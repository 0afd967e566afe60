"""Published mixture-of-experts runs, predicted (issue 50, item 7): each row the published layout
built as a paraplan Plan with its expert layout, simulated on the `dgx-h100-80gb` preset in bf16, and
compared with the published step time. Nothing here is fitted: the preset's figures come from
datasheets (commit a99653f), the expert costs from their closed forms (costs/expert_costs.py), and
the imbalance is the model reference's (1 for the rows whose benchmark forced balance).

Sources, typed in (the table of issue 50 item 7):
  NVIDIA-NeMo/Automodel docs/performance-summary.md, PyTorch FSDP2 + expert parallelism, bf16, seq
  4096, forced balance: DeepSeek-V3 (61 layers, the first 3 dense with FFN 18432; h 7168; 128 heads,
  MLA q 1536 / kv 512; 256 routed experts of FFN 2048 + 1 shared, top-8 in 8 groups top-4; vocabulary
  129,280) on 1,024 H100, PP 4 x VP 8 x EP 64, FSDP 256, global batch 8192: 37.87 s per step; on 256
  H100, FSDP 64, global 512: 8.18 s; Qwen3-30B-A3B (48 layers, h 2048, 32 / 4 heads, 128 experts of
  FFN 768, top-8, vocabulary 151,936) on 8 H100, FSDP 8 x EP 8, global 512: 21.77 s.
  Megatron-MoE-ModelZoo (Megatron-core), Mixtral 8x22B (56 layers, h 6144, FFN 16384, 48 / 8 heads,
  8 experts top-2, vocabulary 32,768) on 128 H100, TP 2 x PP 8 x VP 7 x EP 8, global 256, micro 1,
  seq 4096, dropless routing: 445 TFLOP/s per GPU.
  Megatron-Bridge performance summary 25.11, gpt-oss-120B (its public config: transformers'
  GptOssConfig defaults) on 64 H100, PP 4 x EP 8, global 512, micro 4, seq 4096, forced balance:
  153 TFLOP/s per GPU.
TFLOP/s become seconds through Megatron-LM's `num_floating_point_operations` (megatron/training/
training.py, core_v0.16.1), which counts routed top-k plus shared experts (`megatron_flops`).

The Automodel rows as their benchmark configs (examples/benchmark/configs/*_te_deepep*.yaml, read at
commit 037e04a) ran them: DeepEP's dispatcher (costs/deepep.py), every block recomputed
(`activation_checkpointing: true`: Automodel's MoE apply_ac wraps each block in checkpoint_wrapper),
and FakeBalancedGate's round-robin routing (`expert_routing=round-robin`); the micro-batches as its
table lists them (MBS: DeepSeek-V3 1, Qwen3 4, gpt-oss 2), and its GA column with a pipeline as that
many pipeline schedules a step (DeepSeek-V3 on 1,024 GPUs: 4; `MoeRun.flushes`). Assumed where the sources are silent:
1F1B (interleaved with VP) for pipelines, the kernels as Megatron's fused MoE block
(costs/engine_profile.py: expert_block_kernels; Automodel runs Transformer Engine's), FSDP's
all-gathers not prefetched (Automodel's `reshard_after_forward: false` gathers once a micro-batch:
priced as more), experts dropless (every routed copy computed), the Megatron rows without
recomputation (their sources name none) and with uniform routing (Megatron forces balance by random
logits), the all-to-alls not overlapped with compute unless the row says so. MLA attention is priced
as measured on the transformers module; its fused kernels as 128 heads of the value width plus MLA's
own rotary, norms and query / key assembly (costs/engine_profile.py: mla_kernels).

Writes $PARAPLAN_BENCH_OUT/published_moe_runs.json (default bench-out/) and, with --planner,
published_moe_planner.json (the Megatron grid's plan for each named request). Run:
.venv/bin/python benchmarks/published_moe_runs.py [--planner]
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from paraplan.costs.engine_profile import BlockShape, LatentAttention
from paraplan.hardware import load_cluster
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.plans.schedules import stage_ranks
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import cost_model, measured_model

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
SEQ = 4096
GIB = 2**30

# the zoo's entries (models/zoo.py: the published shapes by their transformers configs); forced balance
# where the source forced it
# where the source forced it; Automodel's benchmark configs force it with FakeBalancedGate, which
# routes token t to experts t k ... t k + k - 1 mod E (`expert_routing=round-robin`), Megatron's with
# random logits (uniform routing, the default)
AUTOMODEL_BALANCE = "expert_imbalance=1&expert_routing=round-robin"
DEEPSEEK_V3 = f"deepseek-v3?{AUTOMODEL_BALANCE}"
QWEN3_30B = f"qwen3-30b-a3b?{AUTOMODEL_BALANCE}"
MIXTRAL_8X22B = "mixtral-8x22b"  # dropless, real routing: the default imbalance
GPT_OSS_120B = "gpt-oss-120b?expert_imbalance=1"
GPT_OSS_120B_AUTOMODEL = f"gpt-oss-120b?{AUTOMODEL_BALANCE}"
GPT_OSS_20B = f"hf:gpt_oss?num_hidden_layers=24&num_local_experts=32&seq_len={SEQ}&{AUTOMODEL_BALANCE}"
AUTOMODEL = "NVIDIA-NeMo/Automodel docs/performance-summary.md"


@dataclass(frozen=True)
class MoeRun:
    label: str
    source: str
    model: str
    gpus: int
    pp: int
    virtual: int
    tp: int
    sdp: int  # FSDP degree (the data axis of the dense view)
    dp: int
    ep: int
    global_batch: int
    micro: int
    engine: str
    published_s: float | None = None
    published_tflops: float | None = None
    flops: dict | None = None  # Megatron's FLOP count's shape, where the source gives TFLOP/s
    block: BlockShape | None = None  # the block as the engine's fused kernels see it
    recompute: str = "none"  # the blocks' (the sources name none)
    dispatcher: str = "alltoall"  # plans/expert_dispatch.py: Automodel's table says "TE + DeepEP"
    overlap: bool = False  # Megatron-LM's all-to-all overlap (plans/expert_overlap.py)
    # pipeline flushes a step: Automodel's table's GA column with PP. Its benchmark recipe
    # (recipes/llm/benchmark.py, 89e3a9fd) calls the pipeline schedule's step() once per accumulation
    # step, so each pays its own fill and drain and FSDP's gathers and reduce-scatters
    flushes: int = 1


MIXTRAL_FLOPS = dict(layers=56, hidden=6144, heads=48, kv_heads=8, head_dim=128, ffn=16384, moe_layers=56,
                     moe_ffn=16384, topk=2, shared_ffn=0, vocab=32768)
GPT_OSS_FLOPS = dict(layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn=2880, moe_layers=36,
                     moe_ffn=2880, topk=4, shared_ffn=0, vocab=201088)
# the blocks as Megatron's fused kernels see them (the dense FFN; an MoE block's expert FFN is derived
# per layer: costs/engine_profile.py expert_block); MLA's heads at its value width, its own rotary,
# norms and query / key assembly (engine_profile.mla_kernels) from the config's widths
DEEPSEEK_BLOCK = BlockShape(7168, 128, 128, 18432, SEQ, gated=True, dropout=False, eager_attention=False,
                            latent=LatentAttention(qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                                                   q_lora_rank=1536, kv_lora_rank=512))
QWEN3_BLOCK = BlockShape(2048, 32, 4, 6144, SEQ, gated=True, dropout=False, eager_attention=False)
MIXTRAL_BLOCK = BlockShape(6144, 48, 8, 16384, SEQ, gated=True, dropout=False, eager_attention=False)
GPT_OSS_BLOCK = BlockShape(2880, 64, 8, 2880, SEQ, gated=True, dropout=False, eager_attention=False)
RUNS = (
    MoeRun("DeepSeek-V3, 1,024 H100", AUTOMODEL, DEEPSEEK_V3, 1024, 4, 8, 1, 256, 1, 64, 8192, 1, "megatron",
           published_s=37.87, block=DEEPSEEK_BLOCK, dispatcher="deepep", recompute="full", flushes=4),
    MoeRun("DeepSeek-V3, 256 H100", AUTOMODEL, DEEPSEEK_V3, 256, 4, 8, 1, 64, 1, 64, 512, 1, "megatron",
           published_s=8.18, block=DEEPSEEK_BLOCK, dispatcher="deepep", recompute="full"),
    MoeRun("Qwen3-30B-A3B, 8 H100", AUTOMODEL, QWEN3_30B, 8, 1, 1, 1, 8, 1, 8, 512, 4, "megatron",
           published_s=21.773, block=QWEN3_BLOCK, dispatcher="deepep", recompute="full"),
    MoeRun("Mixtral 8x22B, 128 H100", "Megatron-MoE-ModelZoo", MIXTRAL_8X22B, 128, 8, 7, 2, 1, 8, 8, 256, 1,
           "megatron", published_tflops=445, flops=MIXTRAL_FLOPS, block=MIXTRAL_BLOCK),
    MoeRun("gpt-oss-120B, 64 H100", "Megatron-Bridge performance summary 25.11", GPT_OSS_120B, 64, 4, 1, 1, 1, 16, 8,
           512, 4, "megatron", published_tflops=153, flops=GPT_OSS_FLOPS, block=GPT_OSS_BLOCK),
)
# published runs the issue does not name (the same Automodel table): gpt-oss, whose table rows say
# "EP -" where the benchmark configs (examples/benchmark/configs/gptoss_{120b,20b}_te_deepep.yaml)
# set ep_size 64 and 8 with DeepEP, FSDP over every GPU, no activation checkpointing
UNNAMED = (
    MoeRun("gpt-oss-120B, 64 H100 (FSDP 64, EP 64)", AUTOMODEL, GPT_OSS_120B_AUTOMODEL, 64, 1, 1, 1, 64, 1, 64, 512,
           2, "megatron", published_s=4.30, block=GPT_OSS_BLOCK, dispatcher="deepep"),
    MoeRun("gpt-oss-20B, 8 H100 (FSDP 8, EP 8)", AUTOMODEL, GPT_OSS_20B, 8, 1, 1, 1, 8, 1, 8, 256, 2, "megatron",
           published_s=10.04, block=GPT_OSS_BLOCK, dispatcher="deepep"),
)


# Qwen3-235B-A22B (its public config: 94 layers, h 4096, 64 / 4 heads of 128, 128 experts of FFN
# 1536, top-8, vocabulary 151,936; every block MoE) on 256 H100 with Megatron-core, the table of
# Megatron-MoE-ModelZoo best_practice/qwen3/readme.md (seq 4096, global batch 2048, bf16, dropless with
# real routing: the table's forced-balance runs are a separate option there). Its dispatcher column
# names DeepEP or A2A per row; "norm, act" recomputation (Megatron's --recompute-modules layernorm
# moe_act) is priced as none (a memory choice; it re-runs two memory-bound kernels).
QWEN3_235B = ("hf:qwen3_moe?num_hidden_layers=94&hidden_size=4096&num_attention_heads=64&num_key_value_heads=4"
              "&head_dim=128&num_local_experts=128&moe_intermediate_size=1536&num_experts_per_tok=8"
              "&vocab_size=151936&intermediate_size=12288&seq_len=4096")
QWEN3_235B_BLOCK = BlockShape(4096, 64, 4, 12288, SEQ, gated=True, dropout=False, eager_attention=False)
ZOO_QWEN3 = "Megatron-MoE-ModelZoo best_practice/qwen3/readme.md (H100)"
QWEN3_235B_RUNS = (
    MoeRun("Qwen3-235B, EP32 across 4 nodes, DeepEP", ZOO_QWEN3, QWEN3_235B, 256, 8, 4, 2, 1, 16, 32, 2048, 1,
           "megatron", published_s=19.7, block=QWEN3_235B_BLOCK, dispatcher="deepep"),
    MoeRun("Qwen3-235B, the same with the A2A overlap", ZOO_QWEN3, QWEN3_235B, 256, 8, 4, 2, 1, 16, 32, 2048, 1,
           "megatron", published_s=17.6, block=QWEN3_235B_BLOCK, dispatcher="deepep", overlap=True),
    MoeRun("Qwen3-235B, EP8 in a node, FSDP, full recompute", ZOO_QWEN3, QWEN3_235B, 256, 1, 1, 2, 128, 1, 8, 2048, 4,
           "megatron", published_s=17.6, block=QWEN3_235B_BLOCK, dispatcher="deepep", recompute="full"),
    MoeRun("Qwen3-235B, EP8 in a node, PP32, A2A", ZOO_QWEN3, QWEN3_235B, 256, 32, 3, 2, 1, 4, 8, 2048, 1,
           "megatron", published_s=24.2, block=QWEN3_235B_BLOCK),
    MoeRun("Qwen3-235B, TP4 x EP8 in a node, DeepEP", ZOO_QWEN3, QWEN3_235B, 256, 8, 4, 4, 1, 8, 8, 2048, 1,
           "megatron", published_s=29.0, block=QWEN3_235B_BLOCK, dispatcher="deepep"),
)


def megatron_flops(shape: dict, batch: int, seq: int) -> float:
    """Megatron-LM's `num_floating_point_operations` for a GQA transformer with MoE layers (BSHD, no
    MTP): 3 (forward, two backward GEMMs) x 2 (FMA) x [tokens x (MLP + routed top-k + shared experts +
    attention projections + logits) + batch x seq^2 x the causal core]; SwiGLU (3 matrices)."""
    h, q = shape["hidden"], shape["heads"] * shape["head_dim"]
    kv = shape["kv_heads"] * shape["head_dim"]
    dense_layers = shape["layers"] - shape["moe_layers"]
    tokens = batch * seq
    mlp = h * (shape["ffn"] * 3 * dense_layers + shape["moe_ffn"] * shape["topk"] * 3 * shape["moe_layers"]
               + shape["shared_ffn"] * 3 * shape["moe_layers"])
    attention = (h * (q + 2 * kv) + q * h) * shape["layers"]
    core = q / 2 * 2 * shape["layers"]
    return 3 * 2 * (tokens * (mlp + attention + h * shape["vocab"]) + batch * seq * seq * core)


def moe_plan(run: MoeRun, spec) -> Plan:
    """The run's layout: TP innermost, then the data axis, then pipeline ranks; blocks cut evenly over
    pp x v stages, the embedding on the first and the head on the last; each MoE block's routed
    experts over ep ranks (etp 1: both engines' recipes), the dense view as the run's."""
    n_layers = len(spec.layers)
    n_stages = run.pp * run.virtual
    blocks = n_layers - 2
    bounds = [0] + [1 + (blocks * k) // n_stages for k in range(1, n_stages)] + [n_layers]
    schedule = "interleaved-1f1b" if run.virtual > 1 else "1f1b" if run.pp > 1 else "gpipe"
    ranks = stage_ranks(schedule, run.pp, run.virtual)
    group = run.tp * run.sdp * run.dp
    stages = []
    for i in range(n_stages):
        devices = tuple(range(ranks[i] * group, (ranks[i] + 1) * group))
        strategies = []
        for layer in range(bounds[i], bounds[i + 1]):
            st = LayerStrategy(dp=run.dp, sdp=run.sdp, tp=run.tp, order="tp,sdp,dp", sequence_parallel=run.tp > 1,
                               zero=1 if run.dp > 1 else 0,
                               recompute=run.recompute if 0 < layer < len(spec.layers) - 1 else "none")
            if spec.layers[layer].experts is not None:
                st = LayerStrategy(dp=st.dp, sdp=st.sdp, tp=st.tp, order=st.order, zero=st.zero,
                                   sequence_parallel=st.sequence_parallel, ep=run.ep, recompute=st.recompute)
            strategies.append(st)
        stages.append(Stage(LayerRange(bounds[i], bounds[i + 1]), devices, strategies=tuple(strategies)))
    replicas = run.sdp * run.dp
    n_micro = run.global_batch // (replicas * run.micro)
    if run.pp == 1 and n_micro > 1:
        schedule = "1f1b"  # gradient accumulation
    return Plan(model=run.model, cluster=f"dgx-h100-80gb?nodes={run.gpus // 8}", n_layers=n_layers,
                global_batch=run.global_batch, n_micro=n_micro, schedule=schedule, stages=tuple(stages),
                grad_sync="after-backward" if run.dp > 1 else "none", precision="bf16", virtual_stages=run.virtual,
                expert_dispatcher=run.dispatcher, expert_overlap=run.overlap)


_MEASURED: dict[str, object] = {}


def predict(run: MoeRun) -> dict:
    if run.model not in _MEASURED:
        _MEASURED[run.model] = measured_model(run.model, precision="bf16", attention="fused")[1]
    spec = _MEASURED[run.model]
    cluster = load_cluster(f"dgx-h100-80gb?nodes={run.gpus // 8}")
    costs = cost_model(spec, cluster, precision="bf16", engine=run.engine, block=run.block)
    flush = replace(run, global_batch=run.global_batch // run.flushes)
    sim = simulate_plan(moe_plan(flush, spec), costs)
    p = sim.prediction
    # each flush a schedule of its own; the optimizer's step and the step's fixed costs once
    iteration_s = run.flushes * p.iteration_s - (run.flushes - 1) * sim.split.after_s
    return {"iteration_s": iteration_s, "fits": p.feasible,
            "peak_gib": max(m.peak_bytes for m in p.memory) / GIB if p.memory else float("nan")}


def rows(runs=RUNS, twins: bool = True) -> list[dict]:
    """Each run predicted against its published time; `twins`: a DeepEP run also priced with the
    alltoall dispatcher (`predicted_alltoall_s`), what the rows were priced as before DeepEP was."""
    out = []
    for run in runs:
        published_s = run.published_s
        if published_s is None:
            published_s = megatron_flops(run.flops, run.global_batch, SEQ) / (run.published_tflops * 1e12 * run.gpus)
        p = predict(run)
        layout = (f"PP{run.pp}{f' x VP{run.virtual}' if run.virtual > 1 else ''}"
                  f"{f' x TP{run.tp}' if run.tp > 1 else ''} x {'FSDP' + str(run.sdp) if run.sdp > 1 else 'DP' + str(run.dp)}"
                  f" x EP{run.ep}{' (DeepEP)' if run.dispatcher == 'deepep' else ''}{', A2A overlap' if run.overlap else ''}")
        row = {"run": run.label, "source": run.source, "engine": run.engine, "gpus": run.gpus, "layout": layout,
               "published_s": round(published_s, 3), "predicted_s": round(p["iteration_s"], 3),
               "time_ratio": round(p["iteration_s"] / published_s, 3), "predicted_peak_gib": round(p["peak_gib"], 1),
               "fits_80gib": p["fits"]}
        if twins and run.dispatcher == "deepep":  # what every routed copy sent on its own (the alltoall dispatcher) would take
            plain = predict(replace(run, dispatcher="alltoall"))["iteration_s"]
            row.update(predicted_alltoall_s=round(plain, 3), time_ratio_alltoall=round(plain / published_s, 3))
        out.append(row)
        print(f"{run.label:>26}: published {row['published_s']} s, predicted {row['predicted_s']} s "
              f"(x{row['time_ratio']}); peak {row['predicted_peak_gib']} GiB", flush=True)
    return out


def planner_against_published(runs=RUNS, planner: str = "megatron-grid") -> list[dict]:
    """Issue 50 item 7's second half: the planner's plan for each published request (model, GPUs,
    global batch, bf16, 80 GB H100s, the megatron profile) against the published layout, both priced
    by the same cost model. The published layouts are predicted without recomputation (none is
    published) and may not fit; the planner's must."""
    from paraplan.planners.registry import make_plan
    from paraplan.workload import workload

    out = []
    for run in runs:
        w = workload(run.model, f"dgx-h100-80gb?nodes={run.gpus // 8}", batch=run.global_batch, precision="bf16",
                     engine="megatron")
        published = simulate_plan(moe_plan(run, w.costs.model), w.costs).prediction
        plan = make_plan(w.request, planner)
        p = plan.prediction
        layouts = sorted({f"EP{st.ep} x ETP{st.etp}" for s in plan.stages for st in s.strategies if st.ep * st.etp > 1})
        row = {"run": run.label, "published_layout_s": round(published.iteration_s, 3),
               "published_layout_fits": published.feasible, "planner": planner, "planner_s": round(p.iteration_s, 3),
               "planner_fits": p.feasible, "planner_layout": f"{plan.n_stages} stages (v={plan.virtual_stages}), "
               f"{plan.n_micro} micro-batches, {sorted({str(x) for s in plan.stages for x in s.strategies})[:3]}",
               "planner_experts": layouts, "ratio": round(p.iteration_s / published.iteration_s, 3)}
        out.append(row)
        print(f"{run.label:>26}: published layout {row['published_layout_s']} s (fits: {published.feasible}); "
              f"{planner} {row['planner_s']} s ({row['planner_layout']}; experts {layouts or 'EP1'})", flush=True)
    return out


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--planner", action="store_true",
                        help="also plan each named request with the Megatron grid and write published_moe_planner.json "
                             "(minutes: DeepSeek-V3 on 1,024 GPUs)")
    args = parser.parse_args()
    table = rows()
    errors = [abs(r["time_ratio"] - 1) for r in table]
    print("published runs the issue does not name:")
    unnamed = rows(UNNAMED)
    print("Qwen3-235B-A22B on 256 H100 (Megatron-MoE-ModelZoo), the issue does not name them either:")
    qwen3 = rows(QWEN3_235B_RUNS)
    result = {"rows": table, "median_abs_time_error": round(statistics.median(errors), 3), "unnamed_rows": unnamed,
              "unnamed_median_abs_time_error": round(statistics.median(abs(r["time_ratio"] - 1) for r in unnamed), 3),
              "qwen3_235b_rows": qwen3,
              "qwen3_235b_median_abs_time_error": round(statistics.median(abs(r["time_ratio"] - 1) for r in qwen3), 3)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "published_moe_runs.json").write_text(json.dumps(result, indent=1))
    print(f"median |time error| {result['median_abs_time_error']:.1%}")
    if args.planner:
        (OUT / "published_moe_planner.json").write_text(json.dumps(planner_against_published(), indent=1))


if __name__ == "__main__":
    main()
