"""FP8 linear layers priced against torchao's published float8 speed-ups over bf16 on H100 (issue 51
item 1): the FP8 / bf16 speed-up of one linear, forward and backward, by its shape (M, K, N).

The published check (pytorch/ao torchao/float8/README.md, "Performance"): tensorwise dynamic scaling,
torch.compile on, casts included, forward and backward: 0.80x at (M, K, N) = (1024, 2048, 1024) and
1.39x at (4096, 8192, 16384). Its script (benchmarks/float8/float8_roofline.py, `--gemm_time_strategy
benchmarks`) times `LNLinearSigmoid` (LayerNorm without affine -> Linear without bias -> Sigmoid,
input M x K requiring grad), compiled, in bf16 and converted to float8, as the sum of its GPU kernel
times (torch.profiler), so host launch gaps do not count. Priced here the same way:

  the module's passes by hand (`ln_linear_sigmoid`): the forward's LayerNorm (reads and writes
  M x K) and Sigmoid (M x N), the backward's Sigmoid and LayerNorm gradients (read two, write one),
  the three GEMMs; in float8 the same with the linear in FP8 (costs/fp8_linear.py, `fused_casts`:
  compiled, the input's amax fused into the LayerNorm and grad_output's into the Sigmoid gradient,
  torchao's `enable_fusion_modeling`);
  on the dgx-h100-80gb preset's H100 (its GEMM model, costs/op_roofline.py, with the FP8 peak and
  efficiency committed before this comparison) with the two figures of the machine the table was
  measured on: Meta's H100 variant, HBM at 2.4 TB/s, and the 2 us a kernel takes at least on the GPU
  (torchao roofline_utils: "run a triton kernel with a single element read/write on an H100 and
  measure GPU time from the trace"), since kernel time, not launch intervals, is what was summed.

A second check, which the model was not built on: torchao's published rowwise table
(benchmarks/torchao_rowwise_table.py: the same module and timing, 216 shapes, each dimension 1024 to
32768), priced the same way in rowwise. Its error is reported over all shapes and over those whose
smallest dimension is at least 4096 and 8192 (an LLM's linears at a micro-batch of 8192 tokens).

Writes $PARAPLAN_BENCH_OUT/fp8_linear.json and fp8_linear.png (left: the speed-up over a sweep of
shapes, the published points marked; right: predicted against published for every published shape).
Run: .venv/bin/python benchmarks/fp8_linear.py
"""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

import torchao_rowwise_table

from paraplan.costs.fp8_linear import fp8_passes
from paraplan.costs.op_roofline import pass_seconds
from paraplan.hardware import load_cluster
from paraplan.models.spec import Affine, Gemm, MemoryOp, PassOps

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
# (M, K, N) -> published speed-up (torchao/float8/README.md, "Example 1" and "Example 2")
PUBLISHED = {(1024, 2048, 1024): 0.80, (4096, 8192, 16384): 1.39}
META_H100_HBM_BYTES_PER_S = 2.4e12  # torchao roofline_utils: "2.4 TB per second, custom to Meta's H100 variant"
GPU_KERNEL_MIN_S = 2.0e-6  # torchao roofline_utils: KERNEL_LAUNCH_OVERHEAD_SEC, measured GPU time of a trivial kernel


def _fixed(x: float) -> Affine:
    return Affine(float(x), 0.0)


def ln_linear_sigmoid(m: int, k: int, n: int) -> tuple[PassOps, PassOps]:
    """LNLinearSigmoid's two passes in bf16 (module docstring), as fixed shapes (batch 1)."""
    one = _fixed(1)
    forward = PassOps(gemms=(Gemm(one, _fixed(m), _fixed(n), _fixed(k), 2),),
                      memory_ops=(MemoryOp(_fixed(2 * 2 * m * k)), MemoryOp(_fixed(2 * 2 * m * n))))
    backward = PassOps(gemms=(Gemm(one, _fixed(m), _fixed(k), _fixed(n), 2),  # grad_input = grad_output @ weight
                              Gemm(one, _fixed(k), _fixed(n), _fixed(m), 2)),  # grad_weight = input^T @ grad_output
                       memory_ops=(MemoryOp(_fixed(3 * 2 * m * n)), MemoryOp(_fixed(3 * 2 * m * k))))
    return forward, backward


def benchmark_device():
    """The preset's H100 as the table's machine and timing see it (module docstring), in fp8 tensorwise."""
    h100 = load_cluster("dgx-h100-80gb?nodes=1").devices[0].spec
    return replace(h100, memory_bandwidth_bytes_per_s=META_H100_HBM_BYTES_PER_S, kernel_overhead_s=GPU_KERNEL_MIN_S)


def speedup(m: int, k: int, n: int, recipe: str = "tensorwise", device=None) -> dict:
    """bf16 and FP8 time of the module's forward and backward, and their ratio."""
    device = device or benchmark_device()
    bf16_device = device.for_precision("bf16")
    fp8_device = device.for_precision("fp8", recipe)
    forward, backward = ln_linear_sigmoid(m, k, n)
    bf16_s = float(pass_seconds(forward, bf16_device, 1.0) + pass_seconds(backward, bf16_device, 1.0))
    f8, b8 = fp8_passes(forward, backward, recipe, fused_casts=True)
    fp8_s = float(pass_seconds(f8, fp8_device, 1.0) + pass_seconds(b8, fp8_device, 1.0))
    return {"M": m, "K": k, "N": n, "recipe": recipe, "bf16_us": round(bf16_s * 1e6, 2), "fp8_us": round(fp8_s * 1e6, 2),
            "speedup": round(bf16_s / fp8_s, 3)}


SWEEP = [(m, k, n) for m in (1024, 2048, 4096, 8192, 16384) for k, n in ((1024, 1024), (2048, 1024), (4096, 4096),
                                                                          (8192, 8192), (8192, 16384), (16384, 8192))]


def rowwise_check() -> dict:
    """Every shape of torchao's rowwise table priced in rowwise, and the error's median by the smallest
    dimension (module docstring)."""
    rows = []
    for m, k, n, published in torchao_rowwise_table.published():
        row = speedup(m, k, n, "rowwise")
        row.update(published=published, error=round(row["speedup"] / published - 1, 3))
        rows.append(row)

    def summary(smallest: int) -> dict:
        errors = [r["error"] for r in rows if min(r["M"], r["K"], r["N"]) >= smallest]
        return {"smallest_dimension_at_least": smallest, "shapes": len(errors),
                "median_abs_error": round(statistics.median(abs(e) for e in errors), 3),
                "mean_error": round(statistics.mean(errors), 3)}

    return {"source": torchao_rowwise_table.SOURCE, "summary": [summary(d) for d in (1024, 2048, 4096, 8192)],
            "rows": rows}


def figure(rows: list[dict], rowwise: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.6))
    for recipe, marker in (("tensorwise", "o"), ("rowwise", "s")):
        pts = sorted((r["M"] * r["K"] * r["N"], r["speedup"]) for r in rows if r["recipe"] == recipe)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker, ms=4, alpha=0.7, label=f"predicted, {recipe}")
    ax.plot([r["M"] * r["K"] * r["N"] for r in rowwise], [r["published"] for r in rowwise], "s", mfc="none",
            color="tab:orange", ms=4, alpha=0.5, label="torchao, published (rowwise)")
    for (m, k, n), s in PUBLISHED.items():
        ax.plot(m * k * n, s, "r*", ms=14, label="torchao, published (tensorwise)" if (m, k, n) == (1024, 2048, 1024) else None)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("M x K x N of the forward GEMM")
    ax.set_ylabel("FP8 / bf16 speed-up (fwd + bwd, casts included)")
    ax.set_title("FP8 linear on H100: predicted and published", fontsize=10)
    ax.legend(fontsize=7)

    smallest = [min(r["M"], r["K"], r["N"]) for r in rowwise]
    dots = bx.scatter([r["published"] for r in rowwise], [r["speedup"] for r in rowwise], c=smallest, s=14,
                      cmap="viridis", norm=matplotlib.colors.LogNorm(), label="rowwise (216 shapes)")
    fig.colorbar(dots, ax=bx, label="smallest of M, K, N")
    for (m, k, n), s in PUBLISHED.items():
        bx.plot(s, speedup(m, k, n)["speedup"], "r*", ms=12,
                label="tensorwise (2 shapes)" if (m, k, n) == (1024, 2048, 1024) else None)
    bx.plot([0.3, 1.9], [0.3, 1.9], color="grey", lw=0.8)
    bx.set_xlabel("published speed-up")
    bx.set_ylabel("predicted speed-up")
    bx.set_title("every published shape: predicted against published", fontsize=10)
    bx.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    checks = []
    for (m, k, n), published in PUBLISHED.items():
        row = speedup(m, k, n)
        row.update(published=published, error=round(row["speedup"] / published - 1, 3))
        checks.append(row)
        print(f"(M, K, N) = ({m}, {k}, {n}): predicted {row['speedup']}x (bf16 {row['bf16_us']} us, fp8 "
              f"{row['fp8_us']} us), published {published}x ({row['error']:+.1%})", flush=True)
    rowwise = rowwise_check()
    for part in rowwise["summary"]:
        print(f"rowwise table, smallest dimension >= {part['smallest_dimension_at_least']}: {part['shapes']} shapes, "
              f"median |error| {part['median_abs_error']:.1%}, mean error {part['mean_error']:+.1%}", flush=True)
    sweep = [speedup(m, k, n, recipe) for recipe in ("tensorwise", "rowwise") for m, k, n in SWEEP]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "fp8_linear.json").write_text(json.dumps({"published_checks": checks, "rowwise_table": rowwise,
                                                     "sweep": sweep}, indent=1))
    figure(sweep, rowwise["rows"], OUT / "fp8_linear.png")
    print(f"wrote {OUT / 'fp8_linear.json'} and fp8_linear.png")


if __name__ == "__main__":
    main()
