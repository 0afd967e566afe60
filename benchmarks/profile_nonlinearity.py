"""Time per sample against micro-batch size for a few layers, measured on this machine, plus the
profiler's honesty checks (step gap, repeatability) for each model.

Writes bench-out/profile_nonlinearity.{json,png} (`make results`: results/; the committed copy
is docs/profile-nonlinearity.png). Run: .venv/bin/python benchmarks/profile_nonlinearity.py
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

from paraplan.profiling.profile_file import profile_to_dict  # noqa: E402
from paraplan.profiling.profiler import run_profile, zoo_workload  # noqa: E402

SIZES = [1, 2, 4, 8, 16, 32, 64]
LAYERS = {"gpt2-tiny": ["block1", "head"], "resnet-tiny": ["stem", "stage1.block0"],
          "lenet-5": ["conv1", "fc1"], "vgg-tiny": ["conv2", "pool_fc1"]}


def main(out_dir: str | None = None) -> None:
    out = Path(out_dir) if out_dir else Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out"))
    out.mkdir(parents=True, exist_ok=True)
    cpu = torch.device("cpu")
    summary, profiles = {}, {}
    for name in LAYERS:
        p = run_profile(zoo_workload(name, cpu), cpu, SIZES, threads=1, warmup=3, repeats=15)
        profiles[name] = p
        summary[name] = {"step_gap": p.step_check.gap, "step_batch": p.step_check.batch,
                         "measured_step_s": p.step_check.measured.median_s,
                         "sum_of_layers_s": p.step_check.sum_of_layers_s,
                         "repeatability_median": statistics.median(p.repeatability),
                         "repeatability_range": [min(p.repeatability), max(p.repeatability)],
                         "nonlinearity": {layer.name: layer.nonlinearity() for layer in p.layers}}
        print(f"{name:12s} step gap {p.step_check.gap:+.1%} at batch {p.step_check.batch}; repeatability "
              f"{min(p.repeatability):.2f}..{max(p.repeatability):.2f}")
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, layer_names in LAYERS.items():
        for layer in profiles[name].layers:
            if layer.name not in layer_names:
                continue
            per_sample = [(f.median_s + b.median_s) / s * 1e6 for f, b, s in zip(layer.forward, layer.backward, SIZES,
                                                                                  strict=True)]
            low = [(f.q1_s + b.q1_s) / s * 1e6 for f, b, s in zip(layer.forward, layer.backward, SIZES, strict=True)]
            high = [(f.q3_s + b.q3_s) / s * 1e6 for f, b, s in zip(layer.forward, layer.backward, SIZES, strict=True)]
            line, = ax.plot(SIZES, per_sample, marker="o", label=f"{name} {layer.name} ({layer.nonlinearity():.1f}x)")
            ax.fill_between(SIZES, low, high, color=line.get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("micro-batch size")
    ax.set_ylabel("forward + backward time per sample (us)")
    ax.set_title(f"Measured on this machine ({profiles['lenet-5'].device_name}, 1 thread):\n"
                 "time is far from proportional to batch size (band: interquartile range)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, title="layer (s/sample at 1 / at 64)", title_fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "profile_nonlinearity.png", dpi=130)
    (out / "profile_nonlinearity.json").write_text(json.dumps(
        {"sizes": SIZES, "summary": summary, "profiles": {n: profile_to_dict(p) for n, p in profiles.items()}},
        indent=1))


if __name__ == "__main__":
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("out_dir", nargs="?", default=None,
                        help="the directory to write into (default: $PARAPLAN_BENCH_OUT, or bench-out)")
    main(parser.parse_args().out_dir)
