"""torchao's published rowwise float8 speed-ups on H100, a check the FP8 linear model was not built on.

Source: pytorch/ao, docs/static/fp8-rowwise-perf.png (added in fdddb2cfa, 2025-06-06, "Add fp8 rowwise
perf table to float8 training readme", #2312; still in the repository in 2026), shown under the float8
README's "Performance", "rowwise scaling". Its title: "Speedup observed vs bfloat16 for LayerNorm ->
Linear -> Sigmoid fwd + bwd by forward M, K, N; dynamic row-wise scaling, PyTorch version
2.8.0a0+git48807d5": the same module, script and timing as the two tensorwise points of
benchmarks/fp8_linear.py (float8_roofline.py, `--float8_recipe_name rowwise`), over every (M, K, N)
with each dimension a power of two from 1024 to 32768. Transcribed by hand from the image (216
values, two decimals as printed); the rows are M then K, the columns N.
"""

from __future__ import annotations

SOURCE = "pytorch/ao docs/static/fp8-rowwise-perf.png (commit fdddb2cfa), PyTorch 2.8.0a0, H100"
SIZES = (1024, 2048, 4096, 8192, 16384, 32768)

# SPEEDUP[M][i][j]: M, K = SIZES[i], N = SIZES[j]
SPEEDUP = {
    1024: ((0.42, 0.42, 0.50, 0.51, 0.56, 0.56),
           (0.40, 0.38, 0.42, 0.50, 0.50, 0.56),
           (0.48, 0.43, 0.46, 0.53, 0.57, 0.60),
           (0.45, 0.48, 0.54, 0.62, 0.60, 0.62),
           (0.46, 0.48, 0.54, 0.60, 0.60, 0.61),
           (0.45, 0.50, 0.55, 0.60, 0.62, 0.65)),
    2048: ((0.43, 0.43, 0.48, 0.55, 0.62, 0.65),
           (0.38, 0.45, 0.58, 0.65, 0.72, 0.75),
           (0.43, 0.50, 0.68, 0.78, 0.81, 0.82),
           (0.46, 0.58, 0.73, 0.82, 0.87, 0.89),
           (0.48, 0.62, 0.75, 0.83, 0.84, 0.85),
           (0.50, 0.64, 0.75, 0.84, 0.83, 0.99)),
    4096: ((0.45, 0.47, 0.57, 0.66, 0.72, 0.76),
           (0.43, 0.53, 0.70, 0.83, 0.90, 0.91),
           (0.44, 0.64, 0.84, 1.01, 1.01, 1.04),
           (0.53, 0.72, 0.91, 1.01, 1.07, 1.13),
           (0.53, 0.74, 0.92, 1.05, 1.10, 1.18),
           (0.54, 0.75, 0.93, 1.02, 1.17, 1.18)),
    8192: ((0.48, 0.52, 0.65, 0.77, 0.83, 0.84),
           (0.45, 0.64, 0.82, 1.01, 1.03, 1.06),
           (0.52, 0.76, 1.00, 1.13, 1.17, 1.19),
           (0.59, 0.85, 1.05, 1.20, 1.31, 1.41),
           (0.58, 0.82, 1.03, 1.22, 1.37, 1.40),
           (0.59, 0.82, 1.04, 1.30, 1.36, 1.46)),
    16384: ((0.48, 0.58, 0.73, 0.86, 0.85, 0.89),
            (0.51, 0.70, 0.90, 1.05, 1.07, 1.15),
            (0.57, 0.79, 1.02, 1.20, 1.26, 1.40),
            (0.61, 0.87, 1.08, 1.33, 1.39, 1.49),
            (0.59, 0.83, 1.07, 1.34, 1.42, 1.55),
            (0.60, 0.85, 1.16, 1.35, 1.48, 1.72)),
    32768: ((0.51, 0.62, 0.77, 0.87, 0.88, 0.94),
            (0.54, 0.73, 0.91, 1.08, 1.14, 1.27),
            (0.59, 0.81, 1.04, 1.28, 1.35, 1.49),
            (0.63, 0.87, 1.11, 1.41, 1.50, 1.62),
            (0.60, 0.83, 1.16, 1.39, 1.49, 1.73),
            (0.63, 0.93, 1.16, 1.48, 1.70, 1.52)),
}


def published() -> list[tuple[int, int, int, float]]:
    """(M, K, N, speed-up) for every shape of the table."""
    return [(m, k, n, SPEEDUP[m][i][j]) for m in SIZES for i, k in enumerate(SIZES) for j, n in enumerate(SIZES)]
