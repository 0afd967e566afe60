"""Published FP8 runs that issue 51 does not name, predicted as its named rows are (benchmarks/
published_fp8_runs.py: `Run`, `predict`, the same assumptions), a check the FP8 model was not built on.

Sources, typed in:
  torchtitan benchmarks/llama3_h100_202412_torchtitan.md (pytorch/torchtitan; the same H100s of 96 GB
  at 2.4 TB/s as the named Tables 4 and 5; torch 1963fc8, torchao eab345c, December 2024), its rows
  "+ torch.compile + Float8" that the issue leaves out:
    Table 1: Llama 3.1 8B, FSDP 8 on 8 GPUs, local batch 2, global 16, selective recomputation:
      8,532 tokens/s per GPU at 76.8 GiB (bf16 with compile, the same table: 6,667 at 77.0).
    Table 3: the same on 128 GPUs, global 256: 8,380 at 61.8 GiB (bf16 with compile: 6,514 at 62.0).
    Table 2: Llama 3.1 8B, FSDP + CP on 8 GPUs, local batch 1, full recomputation: FSDP 8 at sequence
      32,768: 3,890 at 83.9 GiB; FSDP 4 x CP 2 at 65,536: 2,540 at 84.2; FSDP 2 x CP 4 at 131,072:
      1,071 at 84.0; CP 8 at 262,144: 548 at 84.5.
    Table 6: Llama 3.1 405B on 512 GPUs, TP 8 x PP 8 (1F1B) with FSDP x CP = 8, local batch 8, full
      recomputation, AsyncTP: FSDP 8 at sequence 32,768: 76 at 75.3 GiB; FSDP 4 x CP 2 at 65,536:
      47 at 75.9; FSDP 2 x CP 4 at 131,072: 31 at 77.1; CP 8 at 262,144: 16 at 84.9.
  torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (the same H100s; torch 38410cf9, June
  2025), the vanilla-TP column (AsyncTP is not priced), tokens/s per GPU: Llama 3 70B on 256 GPUs,
  FSDP 32 x TP 8, torch.compile, full recomputation, local batch 16: bf16 597.3, float8 tensorwise
  809.8, float8 rowwise 599.6; Llama 3 8B on 64 GPUs, FSDP 8 x TP 8, per-op selective
  recomputation, local batch 12: bf16 4,378, tensorwise 5,078.1, rowwise 3,708.5.
  torchao docs/source/workflows/training.md, "e2e training benchmarks", NVIDIA H100 (pytorch/ao; torch
  2.7.0a0, torchao 0.10.0, torchtitan 0.0.2): Llama 3 8B on 8 H100, batch 1 a GPU, sequence 8192,
  torch.compile, FSDP2, per-op selective recomputation: bf16 6,150 tokens/s (median, per GPU as
  torchtitan logs it) at 47.65 GB; tensorwise with the FP8 all-gather 7,689.5 at 47.77; rowwise with
  the bf16 all-gather 6,768 at 47.79 (GB as printed; torchtitan's memory log counts GiB, so read as GiB).

Assumed where the sources are silent, beyond published_fp8_runs.py's torchtitan assumptions (its eager
profile: compile and AsyncTP not priced; Float8 tensorwise with the FP8 all-gather; sequence
parallelism with TP): Table 6's pipeline runs 8 micro-batches of 1 (torchtitan's default of as many
micro-batches as pipeline ranks, as in Table 5: local 32, 8 micro-batches); CP's attention priced as
costs/axis_costs.py prices a ring; FSDP shards over its own degree, where torchtitan shards the
parameters over FSDP x CP (paraplan's memory is the higher for CP > 1); torchao's H100s are the
same 96 GB, 2.4 TB/s variant as torchtitan's (both Meta's; the page does not say). The bf16 rows
that pair with the FP8 ones are priced too, so that each published FP8 / bf16 speed-up is checked
against the predicted one.

Writes $PARAPLAN_BENCH_OUT/published_fp8_unnamed_runs.json (default bench-out/).
Run: .venv/bin/python benchmarks/published_fp8_unnamed_runs.py
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

from published_fp8_runs import LLAMA3_70B, LLAMA3_70B_BLOCK, TITAN_FP8, rows
from published_runs_today import H100_96, LLAMA_8B, LLAMA_8B_BLOCK, LLAMA_405B_BLOCK, Run, llama

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
TITAN = "torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
TORCHAO = "torchao docs/source/workflows/training.md, NVIDIA H100"
ASYNC_TP = "torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md"
# the named rows' torchtitan settings, the recomputation set per table
TITAN_TENSORWISE = {k: v for k, v in TITAN_FP8.items() if k != "recompute"}
TITAN_BF16 = dict(precision="bf16", engine="torchtitan", sequence_parallel=True, **H100_96)
TITAN_ROWWISE = {**TITAN_TENSORWISE, "fp8_recipe": "rowwise", "fp8_param_gather": False}


def _llama_8b(seq: int) -> tuple[str, object]:
    return llama(32, 4096, 14336, 32, 8, seq=seq), replace(LLAMA_8B_BLOCK, seq_len=seq)


def _llama_405b(seq: int) -> tuple[str, object]:
    return llama(126, 16384, 53248, 128, 8, seq=seq), replace(LLAMA_405B_BLOCK, seq_len=seq)


# Run(label, source, model, block, gpus, tp, pp, sdp, dp, global batch, micro, ...)
TABLE_1_AND_3 = tuple(
    Run(f"Llama 3.1 8B, FSDP {gpus}{', bf16' if bf16 else ''}", f"{TITAN}, Table {table}", LLAMA_8B, LLAMA_8B_BLOCK,
        gpus, 1, 1, gpus, 1, 2 * gpus, 2, recompute="selective", published_tokens_per_gpu_s=tps, published_gib=gib,
        **(TITAN_BF16 if bf16 else TITAN_TENSORWISE))
    for table, gpus, tps, gib, bf16 in ((1, 8, 8532, 76.8, False), (1, 8, 6667, 77.0, True),
                                        (3, 128, 8380, 61.8, False), (3, 128, 6514, 62.0, True)))
TABLE_2 = tuple(
    Run(f"Llama 3.1 8B, FSDP {8 // cp}{f' x CP {cp}' if cp > 1 else ''}, seq {seq:,}", f"{TITAN}, Table 2",
        *_llama_8b(seq), 8, 1, 1, 8 // cp, 1, 8 // cp, 1, recompute="full", cp=cp, published_tokens_per_gpu_s=tps,
        published_gib=gib, **TITAN_TENSORWISE)
    for cp, seq, tps, gib in ((1, 32768, 3890, 83.9), (2, 65536, 2540, 84.2), (4, 131072, 1071, 84.0),
                              (8, 262144, 548, 84.5)))
TABLE_6 = tuple(
    Run(f"Llama 3.1 405B, TP 8 x PP 8 x FSDP {8 // cp}{f' x CP {cp}' if cp > 1 else ''}, seq {seq:,}",
        f"{TITAN}, Table 6", *_llama_405b(seq), 512, 8, 8, 8 // cp, 1, 8 * (8 // cp), 1, recompute="full", cp=cp,
        published_tokens_per_gpu_s=tps, published_gib=gib, **TITAN_TENSORWISE)
    for cp, seq, tps, gib in ((1, 32768, 76, 75.3), (2, 65536, 47, 75.9), (4, 131072, 31, 77.1),
                              (8, 262144, 16, 84.9)))
TORCHAO_8B = tuple(
    Run(f"Llama 3 8B, FSDP 8, {name}", TORCHAO, LLAMA_8B, LLAMA_8B_BLOCK, 8, 1, 1, 8, 1, 8, 1, recompute="selective",
        published_tokens_per_gpu_s=tps, published_gib=gib, **settings)
    for name, tps, gib, settings in (("bf16", 6150, 47.65, TITAN_BF16),
                                     ("tensorwise, FP8 all-gather", 7689.5, 47.77, TITAN_TENSORWISE),
                                     ("rowwise, bf16 all-gather", 6768, 47.79, TITAN_ROWWISE)))
RECIPES = (("bf16", TITAN_BF16), ("tensorwise", TITAN_TENSORWISE), ("rowwise", TITAN_ROWWISE))
ASYNC_TP_70B = tuple(
    Run(f"Llama 3 70B, FSDP 32 x TP 8, {name}", ASYNC_TP, LLAMA3_70B, LLAMA3_70B_BLOCK, 256, 8, 1, 32, 1, 512, 16,
        recompute="full",
        published_tokens_per_gpu_s=tps, **settings)
    for (name, settings), tps in zip(RECIPES, (597.3, 809.8, 599.6), strict=True))
ASYNC_TP_8B = tuple(
    Run(f"Llama 3 8B, FSDP 8 x TP 8, {name}", ASYNC_TP, LLAMA_8B, LLAMA_8B_BLOCK, 64, 8, 1, 8, 1, 96, 12,
        recompute="selective", published_tokens_per_gpu_s=tps, **settings)
    for (name, settings), tps in zip(RECIPES, (4378, 5078.1, 3708.5), strict=True))
RUNS = TABLE_1_AND_3 + TABLE_2 + TABLE_6 + TORCHAO_8B + ASYNC_TP_70B + ASYNC_TP_8B

# (FP8 run, its bf16 run): the published speed-ups the pairs check
SPEED_UPS = ((TABLE_1_AND_3[0], TABLE_1_AND_3[1]), (TABLE_1_AND_3[2], TABLE_1_AND_3[3]),
             (TORCHAO_8B[1], TORCHAO_8B[0]), (TORCHAO_8B[2], TORCHAO_8B[0]),
             *((runs[k], runs[0]) for runs in (ASYNC_TP_70B, ASYNC_TP_8B) for k in (1, 2)))


def speed_ups(table: list[dict]) -> list[dict]:
    by_label = {r["run"]: r for r in table}
    out = []
    for fp8, bf16 in SPEED_UPS:
        if fp8.label not in by_label or bf16.label not in by_label:
            continue  # a pair the table was not asked for
        a, b = by_label[fp8.label], by_label[bf16.label]
        published = b["published_s"] / a["published_s"]
        predicted = b["predicted_s"] / a["predicted_s"]
        out.append({"fp8": fp8.label, "bf16": bf16.label, "published": round(published, 3),
                    "predicted": round(predicted, 3), "error": round(predicted / published - 1, 3)})
    return out


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    table = rows(RUNS)

    def median_error(selected: list[dict]) -> float:
        return round(statistics.median(abs(r["time_ratio"] - 1) for r in selected), 3)

    fp8 = [r for r in table if r["precision"].startswith("fp8")]
    with_cp = [r for r in fp8 if " x CP" in r["layout"]]
    # the source's own note: "the low baseline performance of the vanilla TP float8 rowwise training is
    # being addressed" (torchtitan issue 1207)
    rowwise_tp = [r for r in fp8 if r["precision"] == "fp8 (rowwise)" and r["layout"].startswith("TP8")]
    rest = [r for r in fp8 if r not in with_cp and r not in rowwise_tp]
    result = {"rows": table, "speed_ups": speed_ups(table),
              "median_abs_time_error": {"fp8 rows": median_error(fp8), "all rows": median_error(table),
                                        "fp8 rows without CP or rowwise with TP": median_error(rest),
                                        "fp8 rows with CP 2-8": median_error(with_cp),
                                        "fp8 rowwise with TP (torchtitan issue 1207)": median_error(rowwise_tp)}}
    for s in result["speed_ups"]:
        print(f"{s['fp8']}: FP8 / bf16 published {s['published']}x, predicted {s['predicted']}x ({s['error']:+.1%})")
    for what, error in result["median_abs_time_error"].items():
        print(f"median |time error|, {what}: {error:.1%}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "published_fp8_unnamed_runs.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
