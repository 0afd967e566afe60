"""Measured against predicted: real 2-rank gloo runs of several plans of one model, each against
the simulator with a measured profile and measured links (issue: prediction within 15% for the
demo plan, Spearman rank correlation >= 0.8 across plans).

Writes bench-out/runtime/{runs.json, predicted_vs_measured.png, compare.png, summary.md}
(`make results`: results/runtime/).
Run: .venv/bin/python benchmarks/runtime_vs_simulator.py
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _paraplan_cli import bench_parser, cli  # noqa: E402  (benchmarks/: shared with the other runtime benchmarks)

from paraplan.hardware import load_cluster  # noqa: E402
from paraplan.plans.plan import LayerRange, Plan, Stage  # noqa: E402
from paraplan.plans.plan_file import write_plan  # noqa: E402
from paraplan.runtime.measure.compare import measured_overheads  # noqa: E402
from paraplan.simulator.predict import simulate_plan  # noqa: E402
from paraplan.workload import cost_model, measured_model  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "runtime"
MODEL = "gpt2-tiny"
STEPS = 14
WARMUP_STEPS = 2
# The runtime's own costs (per pipeline action, per step) are read off the measured timeline of the
# demo plan (runtime/measure/compare.py: measured_overheads) and then used to predict every plan.


def pipeline(cuts, n_micro, schedule="1f1b", batch=32) -> Plan:
    bounds = [0, *cuts, 6]
    return Plan(model=MODEL, cluster="local", n_layers=6, global_batch=batch, n_micro=n_micro, schedule=schedule,
                grad_sync="none", stages=tuple(Stage(LayerRange(a, b), (i,)) for i, (a, b) in
                                               enumerate(zip(bounds[:-1], bounds[1:], strict=True))))


def data_parallel(n_micro, sync, batch=32) -> Plan:
    return Plan(model=MODEL, cluster="local", n_layers=6, global_batch=batch, n_micro=n_micro, schedule="gpipe",
                grad_sync=sync, stages=(Stage(LayerRange(0, 6), (0, 1)),))


PLANS = {
    "1f1b 3+3 m=4 (demo)": pipeline([3], 4),
    "1f1b 3+3 m=8": pipeline([3], 8),
    "1f1b 2+4 m=4": pipeline([2], 4),
    "gpipe 3+3 m=2": pipeline([3], 2, schedule="gpipe"),
    "1f1b 3+3 m=2 batch 64": pipeline([3], 2, batch=64),
    "dp 2x1 m=1": data_parallel(1, "after-backward"),
    "dp 2x1 m=4 delayed": data_parallel(4, "gropipe-delayed"),
}



def main() -> None:
    bench_parser(__doc__).parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    profile_path, cluster_path = OUT / "profile.json", OUT / "cluster.toml"
    cli("profile", MODEL, "--batch-sizes", "1,2,4,8,16,32,64", "--repeats", "15", "--out", str(profile_path))
    cli("profile-links", "--out", str(cluster_path))
    _, spec = measured_model(MODEL)
    # the demo plan first: its timeline gives the runtime's overheads
    write_plan(PLANS["1f1b 3+3 m=4 (demo)"], OUT / "plan.json")
    shutil.rmtree(OUT / "calibration", ignore_errors=True)
    cli("train", "--plan", str(OUT / "plan.json"), "--steps", str(STEPS), "--out-dir", str(OUT / "calibration"))
    overheads = measured_overheads(OUT / "calibration")
    action_overhead_s, step_overhead_s = overheads.action_s, overheads.step_s
    print(f"runtime overheads read off the demo timeline: {action_overhead_s * 1e3:.2f} ms per action, "
          f"{step_overhead_s * 1e3:.2f} ms per step", flush=True)
    # two link models: the idle ping-pong just measured, and the `local` preset's 1.5 ms latency
    # (shared/notes: what gloo shows while both cores compute)
    models = {key: cost_model(spec, load_cluster(c), profile=profile_path, overheads=overheads)
              for key, c in (("measured_links", str(cluster_path)), ("local_preset", "local"))}
    rows = []
    for name, plan in PLANS.items():
        plan_path = OUT / "plan.json"
        write_plan(plan, plan_path)
        run_dir = OUT / "run"
        shutil.rmtree(run_dir, ignore_errors=True)
        cli("train", "--plan", str(plan_path), "--steps", str(STEPS), "--out-dir", str(run_dir))
        ranks = [json.loads(f.read_text()) for f in sorted(run_dir.glob("steps_rank*.json"))]
        per_step = [max(r[i] for r in ranks) for i in range(STEPS)][WARMUP_STEPS:]
        measured = statistics.median(per_step)
        q = statistics.quantiles(per_step, n=4)
        predicted = {key: simulate_plan(plan, cm).prediction.iteration_s for key, cm in models.items()}
        rows.append({"plan": name, "measured_s": measured, "q1_s": q[0], "q3_s": q[2],
                     "predicted_s": predicted["local_preset"], "error": predicted["local_preset"] / measured - 1,
                     "predicted_measured_links_s": predicted["measured_links"],
                     "error_measured_links": predicted["measured_links"] / measured - 1})
        print(f"{name:24s} measured {measured * 1e3:6.1f} ms (IQR {q[0] * 1e3:.1f}..{q[2] * 1e3:.1f}), predicted "
              f"{predicted['local_preset'] * 1e3:6.1f} ms ({predicted['local_preset'] / measured - 1:+.1%}); with "
              f"idle-measured links {predicted['measured_links'] * 1e3:6.1f} ms", flush=True)
    # the demo plan once more with --compare: both timelines side by side
    write_plan(PLANS["1f1b 3+3 m=4 (demo)"], OUT / "plan.json")
    shutil.rmtree(OUT / "demo", ignore_errors=True)
    cli("train", "--plan", str(OUT / "plan.json"), "--steps", str(STEPS), "--out-dir", str(OUT / "demo"), "--compare",
        "--profile", str(profile_path), "--cluster", "local", "--overheads", str(OUT / "calibration" / "overheads.json"))
    shutil.copy(OUT / "demo" / "compare.png", OUT / "compare.png")

    def ranks(values):
        order = sorted(range(len(values)), key=lambda i: values[i])
        r = [0.0] * len(values)
        for rank, i in enumerate(order):
            r[i] = float(rank)
        return r

    n = len(rows)

    def spearman_of(key):
        rm, rp = ranks([r["measured_s"] for r in rows]), ranks([r[key] for r in rows])
        return 1 - 6 * sum((a - b) ** 2 for a, b in zip(rm, rp, strict=True)) / (n * (n * n - 1))

    spearman = spearman_of("predicted_s")
    spearman_idle = spearman_of("predicted_measured_links_s")
    (OUT / "runs.json").write_text(json.dumps({"rows": rows, "spearman": spearman, "spearman_idle_links": spearman_idle,
                                               "action_overhead_s": action_overhead_s,
                                               "step_overhead_s": step_overhead_s}, indent=1))
    fig, ax = plt.subplots(figsize=(6, 5))
    for r in rows:
        ax.errorbar(r["measured_s"] * 1e3, r["predicted_s"] * 1e3,
                    xerr=[[(r["measured_s"] - r["q1_s"]) * 1e3], [(r["q3_s"] - r["measured_s"]) * 1e3]], fmt="o")
        ax.annotate(r["plan"], (r["measured_s"] * 1e3, r["predicted_s"] * 1e3), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")
    top = max(max(r["measured_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.15
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.plot([0, top], [0, top * 0.85], color="grey", linewidth=0.5, linestyle=":")
    ax.plot([0, top], [0, top * 1.15], color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured median step (ms), 2 gloo ranks, 1 thread each")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(f"{MODEL}: simulator against real runs (Spearman {spearman:.2f}); dotted: ±15%", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "predicted_vs_measured.png", dpi=120)
    lines = ["# Measured against predicted", "", f"{MODEL} on 2 gloo ranks (1 thread each) on this machine; the "
             "simulator uses a measured profile, blocking transfers with a rendezvous, and the runtime's overheads read "
             f"off the demo plan's timeline: {action_overhead_s * 1e3:.2f} ms per pipeline action and "
             f"{step_overhead_s * 1e3:.2f} ms per step.", "",
             "| plan | measured median (IQR) | predicted, local preset links | error | predicted, idle-measured links | error |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['plan']} | {r['measured_s'] * 1e3:.1f} ms ({r['q1_s'] * 1e3:.1f}..{r['q3_s'] * 1e3:.1f}) | "
                     f"{r['predicted_s'] * 1e3:.1f} ms | {r['error']:+.1%} | {r['predicted_measured_links_s'] * 1e3:.1f} ms "
                     f"| {r['error_measured_links']:+.1%} |")
    lines += ["", f"Spearman rank correlation across the {n} plans: {spearman:.2f} (local preset links), "
              f"{spearman_idle:.2f} (idle-measured links)"]
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
