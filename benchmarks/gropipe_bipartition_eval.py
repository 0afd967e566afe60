"""GroPipe Tables VI-VII and Bi-Partition Fig. 8, reproduced on paraplan's simulator.

Writes bench-out/gropipe_bipartition/{gropipe.json, bipartition.json, gropipe.png, bipartition.png,
summary.md} (`make results`: results/gropipe_bipartition/). Run: .venv/bin/python benchmarks/gropipe_bipartition_eval.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from paraplan.hardware import load_cluster  # noqa: E402
from paraplan.planners.bipartition.planner import plan_bipartition  # noqa: E402
from paraplan.planners.gropipe.planner import plan_gropipe  # noqa: E402
from paraplan.planners.registry import simulator_judge  # noqa: E402
from paraplan.planners.request import PlanRequest  # noqa: E402
from paraplan.workload import workload  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "gropipe_bipartition"
SHAPES = [(2, 2), (2, 3), (2, 4), (3, 2), (4, 2)]  # the paper's (N groups, k stages)
EXTRA = [(8, 1), (1, 8)]  # pure data parallelism and a pure 8-stage pipeline, for context
MICRO = (1, 2, 4, 6, 8, 10, 12, 14, 16)
# GroPipe Table VI/VII: the best throughput (samples/s) and where it was reached
PAPER_PEAK = {"resnet-50": (425.86, "N=4 k=2 m=12"), "resnet-101": (256.70, "N=4 k=2 m=10"),
              "resnet-152": (180.45, "N=4 k=2 m=10"), "vgg-16": (251.80, "N=4 k=2 m=8"),
              "vgg-19": (220.17, "N=4 k=2 m=8")}


def gropipe() -> dict:
    cluster = load_cluster("gropipe-8xt4")
    out = {}
    for model in PAPER_PEAK:
        cm = workload(model, cluster).costs  # one request per shape and batch over the same costs
        rows = []
        for n, k in SHAPES + EXTRA:
            batch = 256 if 256 % n == 0 else 264  # N = 3 cannot split 256 samples evenly: 264 = 3 x 88
            request = PlanRequest(costs=cm, model_name=model, cluster_name=cluster.name, batch=batch)
            _, table = plan_gropipe(request, simulator_judge(request), micro_batches=MICRO, shapes=[(n, k)])
            for r in table:
                r["batch"] = batch
            rows += table
        out[model] = rows
        best = max((r for r in rows if (r["groups"], r["stages"]) in SHAPES), key=lambda r: r["throughput"])
        print(f"GroPipe {model}: best of the paper's shapes N={best['groups']} k={best['stages']} "
              f"m={best['n_micro']}: {best['throughput']:.1f} samples/s", flush=True)
    return out


def bipartition() -> dict:
    cluster = load_cluster("bipartition-7vm")
    setups = [("lenet-5", None, 64, True), ("alexnet", 64, 64, True), ("vgg-16", 32, 128, False)]
    rows = []
    for model, image, batch, check_memory in setups:
        cm = workload(model, cluster, image_size=image).costs  # the model named as the paper names it
        for workers in range(2, 8):
            request = PlanRequest(costs=cm, model_name=model, cluster_name=cluster.name, batch=batch,
                                  n_stages=workers)
            t0 = time.perf_counter()
            bi, bi_table = plan_bipartition(request, simulator_judge(request), check_memory=check_memory,
                                            mode="paper")  # the paper's method (mode=runtime: bipartition_modes.py)
            search_s = time.perf_counter() - t0
            if workers > cm.model.n_layers:  # the layer-wise partition needs a layer per worker
                print(f"Bi-Partition {model} x{workers}: more workers than its {cm.model.n_layers} layers, "
                      "no layer-wise baseline", flush=True)
                continue
            lw, lw_table = plan_bipartition(request, simulator_judge(request), layerwise=True,
                                            check_memory=check_memory)

            def exactly(table, kind=None, n_micro=None, m=workers, check_memory=check_memory):
                """Fig. 8 compares at a fixed worker count: the best candidate with exactly m workers
                (of one kind of division, at one micro-batch count, when given)."""
                rows_m = [r for r in table if r["workers"] == m and (r["feasible"] or not check_memory)
                          and kind in (None, r["division"]) and n_micro in (None, r["n_micro"])]
                return min(rows_m, key=lambda r: r["iteration_s"]) if rows_m else None

            bi_m, lw_m, dp_m = exactly(bi_table), exactly(lw_table), exactly(bi_table, "bipartition")
            if bi_m is None or lw_m is None or dp_m is None:
                continue
            same_p = exactly(bi_table, "bipartition", lw_m["n_micro"]) or dp_m
            rows.append({"model": model, "workers": workers, "batch": batch, "memory_checked": check_memory,
                         "bipartition_s": bi_m["iteration_s"], "layerwise_s": lw_m["iteration_s"],
                         "speedup": lw_m["iteration_s"] / bi_m["iteration_s"],
                         "speedup_dp_division": lw_m["iteration_s"] / dp_m["iteration_s"],
                         # the paper's objective at the layer-wise plan's micro-batch count
                         "bottleneck_bi_s": same_p["bottleneck_s"], "bottleneck_lw_s": lw_m["bottleneck_s"],
                         "best_up_to_workers_s": bi.prediction.iteration_s, "best_workers": bi.n_stages,
                         "layerwise_best_up_to_workers_s": lw.prediction.iteration_s,
                         "search_s": search_s,
                         "stages": [[s.layers.start, s.layers.stop, s.backward.start, s.backward.stop]
                                    for s in bi.stages]})
            print(f"Bi-Partition {model} x{workers}: {rows[-1]['speedup']:.3f}x over layer-wise at exactly "
                  f"{workers} workers; best up to {workers}: {bi.n_stages} workers, "
                  f"{bi.prediction.iteration_s * 1e3:.2f} ms (search {search_s:.2f} s)", flush=True)
    return {"rows": rows}


def figures(g: dict, b: dict) -> None:
    fig, axes = plt.subplots(1, 5, figsize=(22, 4))
    for ax, (model, rows) in zip(axes, g.items(), strict=True):
        for n, k in SHAPES + EXTRA:
            pts = [(r["n_micro"], r["throughput"]) for r in rows if (r["groups"], r["stages"]) == (n, k)]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", linestyle="-" if (n, k) in SHAPES else ":",
                        label=f"N={n}, k={k}")
        ax.set_title(model)
        ax.set_xlabel("micro-batches m")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("simulated throughput (samples/s)")
    axes[0].legend(fontsize=7)
    fig.suptitle("GroPipe Tables VI-VII on the gropipe-8xt4 preset (global batch 256)")
    fig.tight_layout()
    fig.savefig(OUT / "gropipe.png", dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(7, 4))
    for model, colour in zip(("lenet-5", "alexnet", "vgg-16"), ("C0", "C1", "C2"), strict=True):
        rows = [r for r in b["rows"] if r["model"] == model]
        ax.plot([r["workers"] for r in rows], [r["speedup"] for r in rows], marker="o", color=colour,
                label=f"{model}: planner")
        ax.plot([r["workers"] for r in rows], [r["speedup_dp_division"] for r in rows], marker="x", color=colour,
                linestyle=":", label=f"{model}: Bi-Partition's division only")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_xlabel("workers")
    ax.set_ylabel("layer-wise time / Bi-Partition time")
    ax.set_title("Bi-Partition Fig. 8, bipartition-7vm (100 Mbps), exactly M workers", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(OUT / "bipartition.png", dpi=120)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    g = gropipe()
    (OUT / "gropipe.json").write_text(json.dumps(g, indent=1))
    b = bipartition()
    (OUT / "bipartition.json").write_text(json.dumps(b, indent=1))
    figures(g, b)
    lines = ["# GroPipe and Bi-Partition on paraplan's simulator", "",
             "Produced by `benchmarks/gropipe_bipartition_eval.py` with the analytic cost models.", "",
             "## GroPipe (Tables VI-VII): best throughput, samples/s", "",
             "| model | paper (T4 servers) | ours, paper's shapes | ours, any shape incl. pure DP |",
             "|---|---|---|---|"]
    for model, rows in g.items():
        ours = max((r for r in rows if (r["groups"], r["stages"]) in SHAPES), key=lambda r: r["throughput"])
        anyr = max(rows, key=lambda r: r["throughput"])
        paper, where = PAPER_PEAK[model]
        lines.append(f"| {model} | {paper:.1f} ({where}) | {ours['throughput']:.1f} (N={ours['groups']} "
                     f"k={ours['stages']} m={ours['n_micro']}) | {anyr['throughput']:.1f} (N={anyr['groups']} "
                     f"k={anyr['stages']} m={anyr['n_micro']}) |")
    lines += ["", "## Bi-Partition (Fig. 8): layer-wise / Bi-Partition", "",
              "Each cell: simulated 1F1B iteration time ratio of the planner (Bi-Partition's division or its",
              "layer-wise special case, whichever the simulator prefers); then the ratio with Bi-Partition's",
              "own division only; in brackets, the ratio of the paper's objective (the steady-state bottleneck",
              "per micro-batch) at the layer-wise plan's micro-batch count.", "",
              "| model | " + " | ".join(f"{w} workers" for w in range(2, 8)) + " | search, 7 workers |",
              "|---|" + "---|" * 7]
    for model in ("lenet-5", "alexnet", "vgg-16"):
        rs = [r for r in b["rows"] if r["model"] == model]
        by_w = {r["workers"]: r for r in rs}
        lines.append(f"| {model} | " + " | ".join(
            f"{by_w[w]['speedup']:.2f} / {by_w[w]['speedup_dp_division']:.2f} "
            f"({by_w[w]['bottleneck_lw_s'] / by_w[w]['bottleneck_bi_s']:.2f})"
            if w in by_w else "—" for w in range(2, 8)) + f" | {rs[-1]['search_s']:.2f} s |")
    lines += ["", "Best plan with up to M workers (the planner searches every count): workers used, ms", "",
              "| model | " + " | ".join(f"M={w}" for w in range(2, 8)) + " |", "|---|" + "---|" * 6]
    for model in ("lenet-5", "alexnet", "vgg-16"):
        rs = [r for r in b["rows"] if r["model"] == model]
        by_w = {r["workers"]: r for r in rs}
        lines.append(f"| {model} | " + " | ".join(
            f"{by_w[w]['best_workers']} ({by_w[w]['best_up_to_workers_s'] * 1e3:.2f})" if w in by_w else "—"
            for w in range(2, 8)) + " |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
