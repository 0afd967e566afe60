"""Published FP8 runs, and Llama 3 405B at 16,384 GPUs with a 131,072-token context, predicted (issue 51
item 4): each row the published configuration built as a paraplan Plan (benchmarks/
published_runs_today.py: `Run`, `run_plan`, `predict`) and simulated with the profile of the engine
that ran it, in fp8 with the recipe it used. Nothing here is fitted: the H100 preset's FP8 peak and
efficiency were committed before any comparison (e8410f8), the casts are torchao's and Transformer
Engine's byte counts (costs/fp8_linear.py).

Sources, typed in (issue 51, item 4's table):
  MLPerf Training v4.0, NVIDIA `eos_n64` (mlcommons/training_results_v4.0, NVIDIA/benchmarks/gpt3):
  GPT-3 175B (96 layers, h 12288, 96 heads, FFN 4h, sequence 2048) on 512 H100, TP 4 x PP 8 x VP 4,
  global batch 2304, micro-batch 2: 845 tokens/s per GPU, 10.90 s per step (the median of the logged
  train blocks).
  NeMo 24.07 performance summary (NVIDIA/NeMo docs/source/performance/performance_summary.md), FP8:
  GPT-3 175B, sequence 2048, TP 4 x PP 8 x VP 6: 128 H100 at global 256, micro 1: 726 tokens/s per
  GPU; 512 H100 at global 2048, micro 2: 782. Llama 2 70B, sequence 4096, 64 H100, TP 4 x PP 4 x VP 20,
  global 128, micro 1: 1,707. Llama 3 70B, sequence 8192, 64 H100, TP 4 x PP 4 x VP 5 x CP 2, global
  128, micro 1: 1,533.
  torchtitan benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan; H100s of 96 GB HBM2e
  at 2.4 TB/s, power-capped at 500 W), torch.compile + Float8 (tensorwise, with FP8 all-gather):
  Table 4, Llama 3.1 70B on 256 GPUs, FSDP 32 x TP 8, full recomputation, local batch 16, global 512,
  sequence 8192: 829 tokens/s per GPU at 71.9 GiB (AsyncTP: 876 at 67.6). Table 5, Llama 3.1 405B on
  512 GPUs, FSDP 8 x TP 8 x PP 8, global 256, local 32, 8 micro-batches, full recomputation (with
  AsyncTP): 1F1B 100 tokens/s per GPU at 82.5 GiB, interleaved 1F1B (2 stages per rank) 128 at 72.7.
  Llama 3 paper (Dubey et al. 2024) Table 4, long context: Llama 3 405B on 16,384 H100, bf16, TP 8 x
  CP 16 x PP 16 x DP 8, sequence 131,072, 16M tokens (128 sequences): 380 TFLOP/s per GPU, 10.94 s per
  step counting 6N plus causal attention.

Assumed where the sources are silent: NeMo / MLPerf run Megatron-core with Transformer Engine's
delayed scaling (NeMo's FP8 default, `fp8_recipe: delayed`), sequence parallelism with TP, the
distributed optimizer (ZeRO-1), no activation recomputation, no dropout, and their TP communication
overlap not priced (`--tp-comm-overlap`: paraplan prices TP collectives in series, costs/
axis_costs.py); GPT-3's vocabulary 50,257 with learned positions (a GPT-2-shaped model); Llama 2's
vocabulary 32,000. The torchtitan rows: its eager profile (torch.compile's fusion and AsyncTP are not
priced) with FSDP's FP8 all-gather (the blocks' weights gathered and kept at 1 byte) on the 96 GB, 2.4 TB/s
H100 with the power cap assumed to cost nothing, sequence parallelism with TP (torchtitan's TP plan),
memory as torchtitan logs it (the last pipeline rank's first device). Llama 3 at 16,384 GPUs: priced
as Megatron runs it (Meta's engine is not public), interleaved with v = 8 as the 8K rows of
published_runs_today.py, ZeRO-1, sequence parallelism, micro-batch 1 (16 micro-batches), no
recomputation, CP's ring priced as costs/axis_costs.py prices it.

Writes $PARAPLAN_BENCH_OUT/published_fp8_runs.json (default bench-out/) and, with --planner,
published_fp8_planner.json: the Megatron grid's plan for each request (the same model, GPUs, global
batch, precision and recipe, priced as the same engine on the same devices) against the published
layout, both by the same cost model. Run: .venv/bin/python benchmarks/published_fp8_runs.py [--planner]
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from published_runs_today import H100_96, LLAMA_405B_BLOCK, Run, llama, predict

from paraplan.costs.engine_profile import BlockShape

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))

GPT3_175B = ("hf:gpt2?n_layer=96&n_embd=12288&n_head=96&vocab_size=50257&n_positions=2048&seq_len=2048"
             "&resid_pdrop=0&embd_pdrop=0&attn_pdrop=0")
GPT3_BLOCK = BlockShape(12288, 96, 96, 4 * 12288, 2048, gated=False, dropout=False, eager_attention=False)
LLAMA2_70B = ("hf:llama?hidden_size=8192&intermediate_size=28672&num_hidden_layers=80&num_attention_heads=64"
              "&num_key_value_heads=8&vocab_size=32000&max_position_embeddings=4096&seq_len=4096")
LLAMA2_70B_BLOCK = BlockShape(8192, 64, 8, 28672, 4096, gated=True, dropout=False, eager_attention=False)
LLAMA3_70B = llama(80, 8192, 28672, 64, 8)
LLAMA3_70B_BLOCK = BlockShape(8192, 64, 8, 28672, 8192, gated=True, dropout=False, eager_attention=False)
LLAMA_405B_128K = llama(126, 16384, 53248, 128, 8, seq=131072)
LLAMA_405B_128K_BLOCK = replace(LLAMA_405B_BLOCK, seq_len=131072)

MLPERF = "MLPerf Training v4.0, NVIDIA eos_n64"
NEMO = "NeMo 24.07 performance summary"
TORCHTITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
NEMO_FP8 = dict(precision="fp8", engine="megatron", recompute="none", zero=1, sequence_parallel=True,
                fp8_recipe="delayed")
TITAN_FP8 = dict(precision="fp8", engine="torchtitan", recompute="full", sequence_parallel=True, fp8_recipe="tensorwise",
                 fp8_param_gather=True, **H100_96)

# Run(label, source, model, block, gpus, tp, pp, sdp, dp, global batch, micro, ...)
RUNS = (
    Run("GPT-3 175B, 512 H100 (MLPerf)", MLPERF, GPT3_175B, GPT3_BLOCK, 512, 4, 8, 1, 16, 2304, 2, virtual=4,
        published_s=10.90, **NEMO_FP8),
    Run("GPT-3 175B, 128 H100", NEMO, GPT3_175B, GPT3_BLOCK, 128, 4, 8, 1, 4, 256, 1, virtual=6,
        published_tokens_per_gpu_s=726, **NEMO_FP8),
    Run("GPT-3 175B, 512 H100", NEMO, GPT3_175B, GPT3_BLOCK, 512, 4, 8, 1, 16, 2048, 2, virtual=6,
        published_tokens_per_gpu_s=782, **NEMO_FP8),
    Run("Llama 2 70B, 64 H100", NEMO, LLAMA2_70B, LLAMA2_70B_BLOCK, 64, 4, 4, 1, 4, 128, 1, virtual=20,
        published_tokens_per_gpu_s=1707, **NEMO_FP8),
    Run("Llama 3 70B, 64 H100, CP 2", NEMO, LLAMA3_70B, LLAMA3_70B_BLOCK, 64, 4, 4, 1, 2, 128, 1, virtual=5, cp=2,
        published_tokens_per_gpu_s=1533, **NEMO_FP8),
    Run("Llama 3.1 70B, FSDP 32 x TP 8", f"{TORCHTITAN}, Table 4", LLAMA3_70B, LLAMA3_70B_BLOCK, 256, 8, 1, 32, 1,
        512, 16, published_tokens_per_gpu_s=829, published_gib=71.9, **TITAN_FP8),
    Run("Llama 3.1 405B, FSDP 8 x TP 8 x PP 8, 1F1B", f"{TORCHTITAN}, Table 5", llama(126, 16384, 53248, 128, 8),
        LLAMA_405B_BLOCK, 512, 8, 8, 8, 1, 256, 4, published_tokens_per_gpu_s=100, published_gib=82.5, **TITAN_FP8),
    Run("Llama 3.1 405B, the same interleaved (v = 2)", f"{TORCHTITAN}, Table 5", llama(126, 16384, 53248, 128, 8),
        LLAMA_405B_BLOCK, 512, 8, 8, 8, 1, 256, 4, virtual=2, published_tokens_per_gpu_s=128, published_gib=72.7,
        **TITAN_FP8),
    Run("Llama 3 405B, 16,384 H100, seq 131,072", "Dubey et al. 2024, Table 4", LLAMA_405B_128K,
        LLAMA_405B_128K_BLOCK, 16384, 8, 16, 1, 8, 128, 1, "bf16", "megatron", "none", virtual=8, cp=16, zero=1,
        sequence_parallel=True, published_s=10.94),
)


def layout(run: Run) -> str:
    return (f"TP{run.tp}{f' x CP{run.cp}' if run.cp > 1 else ''} x PP{run.pp}"
            f"{f' (v={run.virtual})' if run.virtual > 1 else ''} x "
            f"{'FSDP' + str(run.sdp) if run.sdp > 1 else 'DP' + str(run.dp)}")


def rows(runs=RUNS) -> list[dict]:
    out = []
    for run in runs:
        p = predict(run)
        published_s = run.published_s or run.global_batch * run.block.seq_len / (run.published_tokens_per_gpu_s
                                                                               * run.gpus)
        row = {"source": run.source, "run": run.label, "engine": run.engine, "gpus": run.gpus, "layout": layout(run),
               "precision": run.precision + (f" ({run.fp8_recipe})" if run.fp8_recipe else ""),
               "published_s": round(published_s, 3), "predicted_s": round(p["iteration_s"], 3),
               "time_ratio": round(p["iteration_s"] / published_s, 3),
               "predicted_tokens_per_gpu_s": round(p["tokens_per_gpu_s"], 1),
               "published_gib": run.published_gib, "predicted_gib": round(p["peak_gib"], 1), "fits": p["fits"]}
        out.append(row)
        print(f"{run.label:>44}: published {row['published_s']} s, predicted {row['predicted_s']} s "
              f"(x{row['time_ratio']}); memory {row['predicted_gib']} GiB (published {run.published_gib})", flush=True)
    return out


def planner_against_published(runs=RUNS, planner: str = "megatron-grid") -> list[dict]:
    """Item 4's second half: the planner's plan for each request against the published layout, both
    priced by the same cost model (the published one as `predict` prices it); the planner's must fit
    in the devices' memory, the published layout is priced whether or not it fits."""
    from published_runs_today import _cluster_of

    from paraplan.errors import FieldError
    from paraplan.planners.registry import make_plan
    from paraplan.workload import workload

    out = []
    for run in runs:
        published = predict(run)
        w = workload(run.model, _cluster_of(run), batch=run.global_batch, precision=run.precision,
                     fp8_recipe=run.fp8_recipe or None, fp8_param_gather=run.fp8_param_gather, engine=run.engine)
        try:
            plan = make_plan(w.request, planner)
        except FieldError as exc:  # e.g. no uniform layout without context parallelism
            out.append({"run": run.label, "published_layout": layout(run), "planner": planner, "planner_s": None,
                        "published_layout_s": round(published["iteration_s"], 3), "reason": str(exc)})
            print(f"{run.label:>44}: {planner}: {exc}", flush=True)
            continue
        p = plan.prediction
        strategies = sorted({str(x) for s in plan.stages for x in s.strategies})
        row = {"run": run.label, "published_layout": layout(run), "published_layout_s": round(published["iteration_s"], 3),
               "published_layout_fits": published["fits"], "planner": planner, "planner_s": round(p.iteration_s, 3),
               "planner_fits": p.feasible, "planner_layout": f"{plan.n_ranks} pipeline ranks (v={plan.virtual_stages}), "
               f"{plan.n_micro} micro-batches, {strategies[:2]}", "ratio": round(p.iteration_s / published["iteration_s"], 3)}
        out.append(row)
        print(f"{run.label:>44}: published layout {row['published_layout_s']} s (fits: {published['fits']}); "
              f"{planner} {row['planner_s']} s (fits: {p.feasible}; {row['planner_layout']})", flush=True)
    return out


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--planner", action="store_true",
                        help="also plan each request with the Megatron grid and write published_fp8_planner.json")
    args = parser.parse_args()
    table = rows()
    result = {"rows": table,
              "median_abs_time_error": round(statistics.median(abs(r["time_ratio"] - 1) for r in table), 3)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "published_fp8_runs.json").write_text(json.dumps(result, indent=1))
    print(f"median |time error| {result['median_abs_time_error']:.1%}")
    if args.planner:
        (OUT / "published_fp8_planner.json").write_text(json.dumps(planner_against_published(), indent=1))


if __name__ == "__main__":
    main()
