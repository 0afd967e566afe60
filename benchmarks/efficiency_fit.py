"""The A100 / H100 presets' efficiency terms, fitted once to public microbenchmarks (issue 30, item 4).

The presets' efficiency figures were assumed (0.7 of peak for large kernels, NCCL's bandwidth
guessed). Before any prediction is compared with the published GPU runs of Narayanan et al. 2021
and Korthikanti et al. 2022 (benchmarks/published_runs.py), they are fitted here to public
microbenchmark figures, typed in from their sources, and never to those runs:

  GEMM  max_efficiency = the Maximum Achievable Matmul FLOPS (MAMF) over the dense tensor peak:
        torch.mm in bf16, the best of a sweep of large shapes, mean of 100 iterations after 50
        warm-up (S. Bekman, "Machine Learning Engineering", compute/accelerator/README.md, table
        "Maximum Achievable Matmul FLOPS comparison table", BF16: A100 SXM 271.2 of 312 TFLOPS;
        H100 SXM 794.5 of 989; github.com/stas00/ml-engineering at 744d01e). fp16 runs on the same
        tensor cores at the same peak, so the same fraction is used for it.
  NVLink the intra-node link (alpha, beta) of the ring all-reduce model (costs/collectives.py:
        2(n-1) alpha + 2(n-1)/n M / beta) fitted, least squares on log time, to nccl-tests'
        all_reduce_perf on one 8 x A100 node, 32 KiB to 16 GiB (same book, network/README.md,
        "Real network throughput", 20 rows of size and time). The H100 preset's beta is the A100 fit
        scaled by the two nodes' measured ring bus bandwidths at 16 GiB (same book and table: H200
        node, NVLink 4, ring with NVLS off, 367.61 GB/s; A100 234.89): the book's H200 sweep itself
        reports NVLink SHARP (NCCL's NVLS reduces inside the switch, past the wire's rate), which a
        ring model cannot use.
  NVLS  NCCL's NVLink SHARP all-reduce inside one Hopper node (the switch reduces; issue 48 item 3):
        (alpha, beta) of t = alpha + 2(n-1)/n M / beta fitted, least squares on log time, to
        nccl-tests' all_reduce_perf on one 8 x H200 node (NVLink 4, as the H100's), NVLS on by
        default (Bekman, ml-engineering, network/benchmarks/README.md, "How the calls are timed",
        its nccl-tests column, 32 KiB to 16 GiB, at commit 0cc3de5; NCCL 2.30.7). The curve is NCCL's
        own choice at each size, so the model fitted is NCCL's: the faster of the H100 ring above and
        NVLS, over the rows from 1 MiB up (below it NCCL runs the ring's low-latency protocols, which
        the ring model's one latency does not follow). Across nodes NCCL's tree is priced by NCCL's
        own tuning model (costs/collectives.py), for want of a public multi-node DGX curve.

Not fitted, said in the presets: the size at which a kernel reaches half its efficiency
(half_efficiency_flops; no public sweep by kernel size was found; at the published runs' sizes,
GEMMs of 10^10 to 10^12 FLOPs, it changes compute time by under 1%), HBM bandwidth (the
datasheet's), and InfiniBand (92% of the HDR / NDR line rate, as before: no public DGX multi-node
NCCL curve was found).

Writes $PARAPLAN_BENCH_OUT/efficiency_fit.{json,png} (default bench-out/). The presets
(src/paraplan/hardware/presets/dgx-a100-80gb.toml, dgx-h100-80gb.toml) carry the numbers this
prints; tests/unit/test_efficiency_fit.py checks they agree. Run: .venv/bin/python benchmarks/efficiency_fit.py
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))

# Bekman, ml-engineering, compute/accelerator/README.md, MAMF table (BF16): (MAMF, theory) TFLOPS
MAMF_TFLOPS = {"a100-80gb": (271.2, 312.0), "h100-80gb": (794.5, 989.0)}

# Bekman, ml-engineering, network/README.md, "Real network throughput": nccl-tests
# all_reduce_perf -b 32k -e 16G -f 2 -g 8 on one A100 node: (bytes, time in microseconds)
NCCL_A100_ALLREDUCE = (
    (32_768, 43.83), (65_536, 46.80), (131_072, 51.76), (262_144, 61.38), (524_288, 80.40),
    (1_048_576, 101.9), (2_097_152, 101.4), (4_194_304, 101.5), (8_388_608, 133.5), (16_777_216, 276.6),
    (33_554_432, 424.0), (67_108_864, 684.6), (134_217_728, 1327.6), (268_435_456, 2420.6),
    (536_870_912, 4218.4), (1_073_741_824, 8203.9), (2_147_483_648, 16240.0), (4_294_967_296, 32136.0),
    (8_589_934_592, 64074.0), (17_179_869_184, 127997.0))
NCCL_RANKS = 8
NVLINK3_GBPS = 300.0  # per direction per GPU (datasheet)
# same book, network/README.md, the table under the H200 sweep: busbw at 16 GiB, ring
A100_RING_BUSBW_16GIB, H200_RING_BUSBW_16GIB = 234.89, 367.61
# same book, network/benchmarks/README.md, "How the calls are timed": nccl-tests all_reduce_perf on
# one 8 x H200 node, NVLS on (NCCL's default on an NVSwitch Hopper node): (bytes, bus GB/s)
_KIB, _MIB, _GIB = 2**10, 2**20, 2**30
NCCL_H200_NVLS_ALLREDUCE_BUSBW = (
    (32 * _KIB, 3.20), (64 * _KIB, 6.26), (128 * _KIB, 12.40), (256 * _KIB, 24.63), (512 * _KIB, 48.30),
    (1 * _MIB, 72.45), (2 * _MIB, 91.48), (4 * _MIB, 139.97), (8 * _MIB, 182.03), (16 * _MIB, 242.45),
    (32 * _MIB, 298.44), (64 * _MIB, 369.82), (128 * _MIB, 411.21), (256 * _MIB, 442.27), (512 * _MIB, 455.82),
    (1 * _GIB, 464.00), (2 * _GIB, 468.31), (4 * _GIB, 473.10), (8 * _GIB, 475.16), (16 * _GIB, 480.70))
NVLS_FIT_FROM_BYTES = _MIB


def fit_ring_allreduce(rows=NCCL_A100_ALLREDUCE, n: int = NCCL_RANKS) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) minimising the squared log error of
    t = 2(n-1) alpha + 2(n-1)/n M / beta over the rows: a grid over beta, alpha solved for each."""
    sizes = np.array([r[0] for r in rows], float)
    times = np.array([r[1] for r in rows], float) * 1e-6
    betas = np.geomspace(50e9, 400e9, 1401)[:, None, None]
    alphas = np.geomspace(0.2e-6, 50e-6, 801)[None, :, None]
    model = 2 * (n - 1) * alphas + 2 * (n - 1) / n * sizes[None, None, :] / betas
    err = np.sum(np.log(model / times) ** 2, axis=2)
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return float(alphas[0, j, 0]), float(betas[i, 0, 0])


def fit_nvls_allreduce(ring_alpha: float, ring_beta: float, rows=NCCL_H200_NVLS_ALLREDUCE_BUSBW,
                       n: int = NCCL_RANKS) -> tuple[float, float]:
    """(alpha seconds, beta bytes/s) of NVLS's t = alpha + 2(n-1)/n M / beta minimising the squared
    log error of min(ring, NVLS) (what NCCL picks) over the rows from NVLS_FIT_FROM_BYTES up."""
    sizes = np.array([r[0] for r in rows if r[0] >= NVLS_FIT_FROM_BYTES], float)
    times = 2 * (n - 1) / n * sizes / (np.array([r[1] for r in rows if r[0] >= NVLS_FIT_FROM_BYTES]) * 1e9)
    ring = 2 * (n - 1) * ring_alpha + 2 * (n - 1) / n * sizes / ring_beta
    betas = np.geomspace(200e9, 800e9, 1201)[:, None, None]
    alphas = np.geomspace(0.5e-6, 200e-6, 1201)[None, :, None]
    model = np.minimum(alphas + 2 * (n - 1) / n * sizes[None, None, :] / betas, ring[None, None, :])
    err = np.sum(np.log(model / times) ** 2, axis=2)
    i, j = np.unravel_index(int(np.argmin(err)), err.shape)
    return float(alphas[0, j, 0]), float(betas[i, 0, 0])


def fitted() -> dict:
    alpha, beta = fit_ring_allreduce()
    ratio = beta / (NVLINK3_GBPS * 1e9)
    h100_beta = beta * H200_RING_BUSBW_16GIB / A100_RING_BUSBW_16GIB
    # the H100 ring as the preset carries it (3 significant figures), then NVLS beside it
    nvls_alpha, nvls_beta = fit_nvls_allreduce(float(f"{alpha:.2g}"), float(f"{h100_beta:.3g}"))
    return {
        "gemm_max_efficiency": {name: round(m / peak, 3) for name, (m, peak) in MAMF_TFLOPS.items()},
        "nvlink": {
            "a100-80gb": {"bandwidth_bytes_per_s": float(f"{beta:.3g}"), "latency_s": float(f"{alpha:.2g}")},
            "h100-80gb": {"bandwidth_bytes_per_s": float(f"{h100_beta:.3g}"),
                          "latency_s": float(f"{alpha:.2g}")},
            "fitted_fraction_of_wire": round(ratio, 3),
        },
        "nvls": {"h100-80gb": {"bandwidth_bytes_per_s": float(f"{nvls_beta:.3g}"),
                               "latency_s": float(f"{nvls_alpha:.2g}")}},
    }


def figure(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = np.array([r[0] for r in NCCL_A100_ALLREDUCE], float)
    times = np.array([r[1] for r in NCCL_A100_ALLREDUCE], float) * 1e-6
    link = result["nvlink"]["a100-80gb"]
    n = NCCL_RANKS
    model = 2 * (n - 1) * link["latency_s"] + 2 * (n - 1) / n * sizes / link["bandwidth_bytes_per_s"]
    bus = 2 * (n - 1) / n * sizes
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    ax.semilogx(sizes, bus / times / 1e9, "o", color="#9aa5b1", label="nccl-tests, 8 x A100 (measured)")
    ax.semilogx(sizes, bus / model / 1e9, "-", color="#3b6fb6",
                label=f"ring model: alpha {link['latency_s'] * 1e6:.1f} us, beta {link['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s")
    ax.set_xlabel("all-reduce payload (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title("NVLink 3 all-reduce: the fit the dgx-a100-80gb preset uses")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    # NVLS: NCCL's choice on an 8 x H200 node against min(ring, NVLS) as the h100 preset prices it
    h_sizes = np.array([r[0] for r in NCCL_H200_NVLS_ALLREDUCE_BUSBW], float)
    h_bus = np.array([r[1] for r in NCCL_H200_NVLS_ALLREDUCE_BUSBW])
    ring_h, nvls = result["nvlink"]["h100-80gb"], result["nvls"]["h100-80gb"]
    h_bytes = 2 * (n - 1) / n * h_sizes
    t_ring = 2 * (n - 1) * ring_h["latency_s"] + h_bytes / ring_h["bandwidth_bytes_per_s"]
    t_nvls = nvls["latency_s"] + h_bytes / nvls["bandwidth_bytes_per_s"]
    ax2.semilogx(h_sizes, h_bus, "o", color="#9aa5b1", label="nccl-tests, 8 x H200, NVLS on (measured)")
    ax2.semilogx(h_sizes, h_bytes / t_ring / 1e9, ":", color="#9a6fb6", label="ring model (h100 preset)")
    ax2.semilogx(h_sizes, h_bytes / np.minimum(t_ring, t_nvls) / 1e9, "-", color="#3b6fb6",
                 label=f"min(ring, NVLS): NVLS alpha {nvls['latency_s'] * 1e6:.0f} us, "
                       f"beta {nvls['bandwidth_bytes_per_s'] / 1e9:.0f} GB/s")
    ax2.axvline(NVLS_FIT_FROM_BYTES, color="#cccccc", lw=1)
    ax2.set_xlabel("all-reduce payload (bytes)")
    ax2.set_title("NVLink 4 with NVLS (fitted from 1 MiB up)")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    result = fitted()
    (OUT / "efficiency_fit.json").write_text(json.dumps(result, indent=2) + "\n")
    figure(result, OUT / "efficiency_fit.png")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
