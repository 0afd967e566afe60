"""Published runs the cost model was not developed against (issue 48, item 5): today's H100 runs with
torchtitan, BLOOM-176B with Megatron-DeepSpeed, Llama 3 405B at 8,192 and 16,384 GPUs. Each row is
the published configuration built as a paraplan Plan and simulated with the engine profile of the
engine that ran it (costs/engine_profile.py). Nothing here is fitted: the presets' figures come from
datasheets and publications (commit a99653f, before this file first ran). Rows are reported as
they come; the summary is in docs/published-runs.md.

Sources, typed in:
  torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan): H100s with 96 GB
  HBM2e at 2.4 TB/s, power-capped at 500 W. Table 1: Llama 3.1 8B, FSDP 8 on 8 GPUs, bf16, eager,
  selective (per-operator) activation checkpointing, local batch 2, sequence 8192: 5,762 tokens/s
  per GPU at 82.4 GiB. Table 3: the same on 128 GPUs: 5,605 tokens/s/GPU at 67.0 GiB. Table 5:
  Llama 3.1 405B, FSDP 8 x TP 8 x PP 8 on 512 GPUs, global batch 256 (local 32 per FSDP rank), 8
  micro-batches, full checkpointing: 1F1B 100 tokens/s/GPU at 82.5 GiB, interleaved 1F1B (2
  stages per rank) 128 at 72.7 GiB, measured with torch.compile, Float8 and AsyncTP (absolute
  times need FP8, which issue 51 adds: only the two orderings are checked here).
  BLOOM-176B, bigscience train/tr11-176B-ml/README.md: 384 A100-80GB, 70 layers, hidden 14336, 112
  heads, vocabulary 250,880, sequence 2048, TP 4 x PP 12 x DP 8, ZeRO-1, bf16, global batch 2048,
  micro-batch 2, activation checkpointing: 104.70 s per iteration. ALiBi is not supported by
  paraplan's zoo (`hf:bloom` is refused): a GPT-2-shaped stand-in with learned positions (2,048 x
  14,336 more parameters, 0.02%) and no dropout (BLOOM's 0.0) stands in, priced as Megatron runs
  a GPT block; ALiBi's bias enters the QK^T GEMM as its beta term in Megatron-DeepSpeed.
  Llama 3 405B, Dubey et al. 2024 ("The Llama 3 Herd of Models") Table 4: 126 layers, hidden 16384,
  FFN 53248, 128 heads, 8 KV heads, vocabulary 128,256, sequence 8192, 16M tokens per batch (2,048
  sequences), bf16, TP 8 x PP 16 with DP 64 on 8,192 H100: 430 TFLOP/s per GPU; DP 128 on 16,384:
  400. Interleaved with one layer per chunk (v = 8), the first chunk holding only the embedding.
  Counting FLOPs as 6N plus causal attention, those rates are 12.08 s and 6.49 s per step.

Assumed, where the sources are silent: micro-batch 1 for Llama 3 (32 and 16 micro-batches per step),
with sequence parallelism beside its TP (as torchtitan's TP plan for Table 5), and its optimizer
states and gradients sharded over DP (§3.3.2: ZeRO-1 here: gradients reduce-scattered once per step);
full recomputation off for Llama 3 (its paper does not say; with 80 GB and 1 layer per chunk it
fits); the H100 96GB's power cap assumed to cost nothing (no published GEMM rate at 500 W was found:
the torchtitan rows are optimistic by what it costs); FSDP2 prefetching its all-gathers
(torchtitan's default); the Llama 3 engine priced as Megatron's (Meta's is not public).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from paraplan.costs.engine_profile import BlockShape
from paraplan.hardware import load_cluster
from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage
from paraplan.plans.schedules import stage_ranks
from paraplan.simulator.predict import simulate_plan
from paraplan.workload import cost_model, measured_model

GIB = 2**30


def llama(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, seq: int = 8192) -> str:
    return (f"hf:llama?hidden_size={hidden}&intermediate_size={ffn}&num_hidden_layers={layers}"
            f"&num_attention_heads={heads}&num_key_value_heads={kv_heads}&vocab_size=128256"
            f"&max_position_embeddings={seq}&seq_len={seq}")


@dataclass(frozen=True)
class Run:
    label: str
    source: str
    model: str
    block: BlockShape
    gpus: int
    tp: int
    pp: int
    sdp: int  # FSDP / ZeRO-3 degree
    dp: int  # replicated data parallelism
    global_batch: int
    micro: int
    precision: str
    engine: str
    recompute: str
    virtual: int = 1
    zero: int = 0
    cluster: str = "dgx-h100-80gb"
    memory_gib: float | None = None  # the published devices' memory where the preset's differs
    bandwidth: float | None = None  # their HBM bandwidth where it differs
    attention: str = "fused"
    sequence_parallel: bool = False
    published_s: float | None = None
    published_tokens_per_gpu_s: float | None = None
    published_gib: float | None = None
    schedule: str = ""  # "" : 1f1b / interleaved-1f1b / gpipe from pp and virtual
    fp8_recipe: str = ""  # precision fp8's scaling recipe (benchmarks/published_fp8_runs.py)
    cp: int = 1  # context parallelism, right outside TP
    fp8_param_gather: bool = False  # an fp8 run's FSDP all-gathers in FP8 (Plan.fp8_param_gather)


H100_96 = {"memory_gib": 96.0, "bandwidth": 2.4e12}  # torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s
LLAMA_8B = llama(32, 4096, 14336, 32, 8)
LLAMA_8B_BLOCK = BlockShape(4096, 32, 8, 14336, 8192, gated=True, dropout=False, eager_attention=False)
LLAMA_405B = llama(126, 16384, 53248, 128, 8)
LLAMA_405B_BLOCK = BlockShape(16384, 128, 8, 53248, 8192, gated=True, dropout=False, eager_attention=False)
BLOOM = ("hf:gpt2?n_layer=70&n_embd=14336&n_head=112&vocab_size=250880&n_positions=2048&seq_len=2048"
         "&resid_pdrop=0&embd_pdrop=0&attn_pdrop=0")
BLOOM_BLOCK = BlockShape(14336, 112, 112, 4 * 14336, 2048, gated=False, dropout=False, eager_attention=True)
TORCHTITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"

RUNS = (
    Run("Llama 3.1 8B, FSDP 8", f"{TORCHTITAN}, Table 1", LLAMA_8B, LLAMA_8B_BLOCK, 8, 1, 1, 8, 1, 16, 2, "bf16",
        "torchtitan", "selective", published_tokens_per_gpu_s=5762, published_gib=82.4, **H100_96),
    Run("Llama 3.1 8B, FSDP 128", f"{TORCHTITAN}, Table 3", LLAMA_8B, LLAMA_8B_BLOCK, 128, 1, 1, 128, 1, 256, 2,
        "bf16", "torchtitan", "selective", published_tokens_per_gpu_s=5605, published_gib=67.0, **H100_96),
    Run("BLOOM-176B (GPT-2-shaped stand-in)", "bigscience tr11-176B-ml README", BLOOM, BLOOM_BLOCK, 384, 4, 12, 1, 8,
        2048, 2, "bf16", "megatron", "full", zero=1, cluster="dgx-a100-80gb", attention="math", published_s=104.70),
    Run("Llama 3 405B, 8,192 GPUs", "Dubey et al. 2024, Table 4", LLAMA_405B, LLAMA_405B_BLOCK, 8192, 8, 16, 1, 64,
        2048, 1, "bf16", "megatron", "none", virtual=8, sequence_parallel=True, zero=1, published_s=12.08),
    Run("Llama 3 405B, 16,384 GPUs", "Dubey et al. 2024, Table 4", LLAMA_405B, LLAMA_405B_BLOCK, 16384, 8, 16, 1, 128,
        2048, 1, "bf16", "megatron", "none", virtual=8, sequence_parallel=True, zero=1, published_s=6.49),
)
# torchtitan Table 5: the orderings only (the run used Float8, which issue 51 adds)
TABLE_5 = Run("Llama 3.1 405B, FSDP 8 x TP 8 x PP 8", f"{TORCHTITAN}, Table 5", LLAMA_405B, LLAMA_405B_BLOCK, 512, 8,
              8, 8, 1, 256, 4, "bf16", "torchtitan", "full", sequence_parallel=True, **H100_96)
TABLE_5_PUBLISHED = {"1f1b": (100, 82.5), "interleaved-1f1b": (128, 72.7)}  # tokens/s/GPU, GiB


def run_plan(run: Run, n_layers: int) -> Plan:
    """The run's layout as a Plan: TP innermost, then FSDP / DP, then pipeline ranks (Megatron's and
    torchtitan's order); blocks cut evenly over pp x v stages, the embedding on the first and the
    head on the last; every block with the run's recomputation."""
    n_stages = run.pp * run.virtual
    blocks = n_layers - 2
    bounds = [0] + [1 + (blocks * k) // n_stages for k in range(1, n_stages)] + [n_layers]
    schedule = run.schedule or ("interleaved-1f1b" if run.virtual > 1 else "1f1b" if run.pp > 1 else "gpipe")
    ranks = stage_ranks(schedule, run.pp, run.virtual)
    group = run.tp * run.cp * run.sdp * run.dp
    stages = []
    for i in range(n_stages):
        devices = tuple(range(ranks[i] * group, (ranks[i] + 1) * group))
        strategies = tuple(LayerStrategy(dp=run.dp, sdp=run.sdp, tp=run.tp, cp=run.cp, zero=run.zero,
                                         order="tp,sdp,dp", sequence_parallel=run.sequence_parallel and run.tp > 1,
                                         recompute=run.recompute if 0 < layer < n_layers - 1 else "none")
                           for layer in range(bounds[i], bounds[i + 1]))
        stages.append(Stage(LayerRange(bounds[i], bounds[i + 1]), devices, strategies=strategies))
    replicas = run.sdp * run.dp
    return Plan(model=run.model, cluster=f"{run.cluster}?nodes={run.gpus // 8}", n_layers=n_layers,
                global_batch=run.global_batch, n_micro=run.global_batch // (replicas * run.micro), schedule=schedule,
                stages=tuple(stages), grad_sync="after-backward" if run.dp * run.cp > 1 else "none",
                precision=run.precision, virtual_stages=run.virtual, fp8_recipe=run.fp8_recipe,
                fp8_param_gather=run.fp8_param_gather)


_MEASURED: dict[tuple, object] = {}


def _cluster_of(run: Run):
    """The run's cluster: the preset at its size, with the published devices' memory and bandwidth."""
    cluster = load_cluster(f"{run.cluster}?nodes={run.gpus // 8}")
    if run.memory_gib or run.bandwidth:
        device = cluster.device(0)
        device = replace(device, memory_bytes=int((run.memory_gib or device.memory_bytes / GIB) * GIB),
                         memory_bandwidth_bytes_per_s=run.bandwidth or device.memory_bandwidth_bytes_per_s)
        cluster = replace(cluster, nodes=tuple(replace(n, devices=(device,) * len(n.devices)) for n in cluster.nodes))
    return cluster


def predict(run: Run) -> dict:
    key = (run.model, run.precision, run.attention)
    if key not in _MEASURED:
        _MEASURED[key] = measured_model(run.model, precision=run.precision, attention=run.attention)[1]
    spec = _MEASURED[key]
    cluster = _cluster_of(run)
    costs = cost_model(spec, cluster, precision=run.precision, engine=run.engine, block=run.block,
                       fp8_recipe=run.fp8_recipe or None, fp8_param_gather=run.fp8_param_gather)
    prediction = simulate_plan(run_plan(run, len(spec.layers)), costs).prediction
    tokens = run.global_batch * run.block.seq_len
    peak = max(m.peak_bytes for m in prediction.memory) / GIB if prediction.memory else float("nan")
    # the device whose memory the run's log reports: torchtitan logs the first rank of the last
    # pipeline stage (components/metrics.py: _get_metrics_rank; rank 0 without a pipeline)
    logged = (run.pp - 1) * run.tp * run.cp * run.sdp * run.dp
    logged_gib = next((m.peak_bytes / GIB for m in prediction.memory if m.device == logged), peak)
    return {"iteration_s": prediction.iteration_s, "tokens_per_gpu_s": tokens / prediction.iteration_s / run.gpus,
            "peak_gib": logged_gib if run.engine == "torchtitan" else peak, "max_gib": peak, "fits": prediction.feasible}


def rows() -> list[dict]:
    out = []
    for run in RUNS:
        p = predict(run)
        published_s = run.published_s or run.global_batch * run.block.seq_len / (run.published_tokens_per_gpu_s
                                                                               * run.gpus)
        row = {"source": run.source, "run": run.label, "engine": run.engine, "gpus": run.gpus,
               "layout": f"TP{run.tp} x PP{run.pp}{f' (v={run.virtual})' if run.virtual > 1 else ''} x "
                         f"{'FSDP' + str(run.sdp) if run.sdp > 1 else 'DP' + str(run.dp)}",
               "published_s": round(published_s, 3), "predicted_s": round(p["iteration_s"], 3),
               "time_ratio": round(p["iteration_s"] / published_s, 3),
               "predicted_tokens_per_gpu_s": round(p["tokens_per_gpu_s"], 1),
               "published_gib": run.published_gib, "predicted_gib": round(p["peak_gib"], 1)}
        out.append(row)
        print(f"{run.label:>36}: published {row['published_s']} s, predicted {row['predicted_s']} s "
              f"(x{row['time_ratio']}); memory {row['predicted_gib']} GiB (published {run.published_gib})", flush=True)
    return out


def table_5_orderings() -> dict:
    """torchtitan Table 5's two schedules: which is faster and which uses less memory, on the device
    torchtitan logs (the last pipeline rank's first); `max_gib` is the most any device holds."""
    plain = predict(TABLE_5)
    interleaved = predict(replace(TABLE_5, virtual=2))
    ours = {"1f1b": plain, "interleaved-1f1b": interleaved}
    published_faster = max(TABLE_5_PUBLISHED, key=lambda k: TABLE_5_PUBLISHED[k][0])
    published_smaller = min(TABLE_5_PUBLISHED, key=lambda k: TABLE_5_PUBLISHED[k][1])
    faster = max(ours, key=lambda k: ours[k]["tokens_per_gpu_s"])
    smaller = min(ours, key=lambda k: ours[k]["peak_gib"])
    return {"published": TABLE_5_PUBLISHED,
            "predicted": {k: (round(v["tokens_per_gpu_s"], 1), round(v["peak_gib"], 1)) for k, v in ours.items()},
            "predicted_max_gib": {k: round(v["max_gib"], 1) for k, v in ours.items()},
            "time_ordering_right": faster == published_faster, "memory_ordering_right": smaller == published_smaller}


# sail-sg/zero-bubble-pipeline-parallelism issue #21: a 6.2B model on 8 H800, samples/s and GB per
# schedule. The thread gives neither the pipeline degree, the micro-batches nor the shape; assumed:
# the zero-bubble paper's 6.2B configuration (Qi et al. 2024, Table 3: 30 layers, hidden 4096, 32
# heads, sequence 1024), PP 8 on one node, micro-batch 1, 24 micro-batches, Megatron's kernels (the
# repository is a Megatron-LM fork), H800 as the H100 preset (its NVLink is 400 GB/s, not used by
# PP's sends within a node at these sizes). ZB-2P is paraplan's zb-2p (plans/zero_bubble_auto.py: the
# paper's heuristic without its ILP refinement).
ZB_PUBLISHED = {"1f1b": (55, 48), "interleaved-1f1b": (66, 57), "zb-2p": (67, 79), "zbv": (64, 53)}
ZB_MODEL = "hf:gpt2?n_layer=30&n_embd=4096&n_head=32&vocab_size=50257&n_positions=1024&seq_len=1024"
ZB_BLOCK = BlockShape(4096, 32, 32, 4 * 4096, 1024, gated=False, dropout=True, eager_attention=False)
ZB_RUN = Run("6.2B, PP 8", "sail-sg/zero-bubble-pipeline-parallelism#21", ZB_MODEL, ZB_BLOCK, 8, 1, 8, 1, 1, 24, 1,
             "bf16", "megatron", "none")


def zero_bubble_orderings() -> dict:
    """The orderings the thread's numbers resolve (a tie where they differ by under 2%: 66 and 67),
    against the predicted ones."""
    runs = {"1f1b": ZB_RUN, "interleaved-1f1b": replace(ZB_RUN, virtual=2),
            "zb-2p": replace(ZB_RUN, schedule="zb-2p"), "zbv": replace(ZB_RUN, virtual=2, schedule="zbv")}
    ours = {k: predict(r) for k, r in runs.items()}
    pairs = []
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for what, index, key, larger_better in (("time", 0, "tokens_per_gpu_s", True),
                                                      ("memory", 1, "peak_gib", False)):
                pa, pb = ZB_PUBLISHED[a][index], ZB_PUBLISHED[b][index]
                if abs(pa / pb - 1) < 0.02:
                    continue  # a tie in the thread: no ordering to check
                published_a_better = (pa > pb) == larger_better
                predicted_a_better = (ours[a][key] > ours[b][key]) == larger_better
                pairs.append({"pair": f"{a} vs {b}", "what": what, "right": published_a_better == predicted_a_better})
    return {"published": ZB_PUBLISHED,
            "predicted": {k: {"samples_per_s": round(ZB_RUN.global_batch / v["iteration_s"], 1),
                              "peak_gib": round(v["peak_gib"], 1)} for k, v in ours.items()},
            "orderings": pairs, "right": sum(p["right"] for p in pairs), "of": len(pairs)}
