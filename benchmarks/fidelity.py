"""Fidelity of the predictions on this machine (issue 18): measured against predicted for plans
whose predicted times span at least 2x, after `paraplan calibrate`.

The machine is calibrated once (`paraplan calibrate`: compute fitted on gpt2-tiny, vgg-tiny,
bert-tiny; links; runtime overheads; TP / SDP machinery measured on gpt2-tiny) and the evaluated
model is one the calibration never ran, llama-tiny, profiled with `paraplan profile`. Eight plans
of llama-tiny at global batch 32 on 2 ranks (one process, data parallel, four pipelines, SDP2, TP2)
run as real `paraplan train` processes, interleaved (A B C ... A B C ...) over rounds so that the
machine's drift hits every plan alike; a plan's measured time is the median over rounds of each
run's median step. This is repeated 3 times; each repetition reports the median absolute error
and Spearman's rank correlation between predicted and measured (targets: <= 15% and >= 0.8).

Writes bench-out/fidelity/{fidelity.json, fidelity.png, summary.md} (`make results`: results/).
Run: .venv/bin/python benchmarks/fidelity.py [--rounds 3] [--steps 12] [--repetitions 3]
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _paraplan_cli import bench_parser, cli  # noqa: E402

from paraplan.plans.plan import LayerRange, LayerStrategy, Plan, Stage  # noqa: E402
from paraplan.runtime.launcher.prove import run_interleaved, spearman  # noqa: E402
from paraplan.simulator.predict import simulate_plan  # noqa: E402
from paraplan.workload import workload  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "fidelity"
MODEL = "llama-tiny"  # not one of the calibration's models
BATCH = 32


def _plan(stages, n_micro=1, schedule="1f1b", grad_sync="none") -> Plan:
    return Plan(model=MODEL, cluster="local", n_layers=6, global_batch=BATCH, n_micro=n_micro, schedule=schedule,
                grad_sync=grad_sync, stages=tuple(stages))


def pipeline(cut: int, n_micro: int, schedule: str = "1f1b") -> Plan:
    return _plan([Stage(LayerRange(0, cut), (0,)), Stage(LayerRange(cut, 6), (1,))], n_micro, schedule)


def strategy(st: LayerStrategy) -> Plan:
    return _plan([Stage(LayerRange(0, 6), (0, 1), strategies=(st,) * 6)], 1, "gpipe")


PLANS = {
    "one process": _plan([Stage(LayerRange(0, 6), (0,))], 1, "gpipe"),
    "data parallel 2": _plan([Stage(LayerRange(0, 6), (0, 1))], 1, "gpipe", "after-backward"),
    "1F1B 3+3, m=4": pipeline(3, 4),
    "1F1B 3+3, m=8": pipeline(3, 8),
    "1F1B 1+5, m=4": pipeline(1, 4),
    "GPipe 3+3, m=2": pipeline(3, 2, "gpipe"),
    "SDP2 every layer": strategy(LayerStrategy(sdp=2)),
    "TP2 every layer": strategy(LayerStrategy(tp=2)),
}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--cluster", default=None, help="an existing calibrated cluster file (default: calibrate)")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    cluster_path = Path(args.cluster) if args.cluster else OUT / "local-calibrated.toml"
    if not args.cluster:
        print("calibrating this machine (paraplan calibrate) ...", flush=True)
        print(cli("calibrate", "--out", str(cluster_path)), flush=True)
    profile_path = OUT / f"{MODEL}-profile.json"
    cli("profile", MODEL, "--batch-sizes", "2,4,8,16,32", "--repeats", "9", "--out", str(profile_path))
    cm = workload(MODEL, cluster_path, profile=profile_path).costs
    judged = {name: (plan, simulate_plan(plan, cm).prediction.iteration_s) for name, plan in PLANS.items()}
    predicted = [p for _, p in judged.values()]
    print("predicted: " + ", ".join(f"{n} {p * 1e3:.1f} ms" for n, (_, p) in judged.items())
          + f"; span {max(predicted) / min(predicted):.2f}x", flush=True)
    reps = []
    for rep in range(args.repetitions):
        measured = run_interleaved(judged, args.rounds, args.steps,
                                   progress=lambda text, r=rep: print(f"repetition {r + 1}: {text}", flush=True))
        errors = [abs(m.error) for m in measured]
        rho = spearman([m.predicted_s for m in measured], [m.median_s for m in measured])
        reps.append({"plans": [{"name": m.name, "predicted_s": m.predicted_s, "rounds_s": list(m.rounds_s),
                                "measured_s": m.median_s, "error": m.error} for m in measured],
                     "median_abs_error": statistics.median(errors), "spearman": rho})
        print(f"repetition {rep + 1}: median |error| {statistics.median(errors):.1%}, Spearman {rho:.2f}; "
              + ", ".join(f"{m.name} {m.median_s * 1e3:.1f} ms ({m.error:+.0%})" for m in measured), flush=True)
    result = {"model": MODEL, "batch": BATCH, "ranks": 2, "rounds": args.rounds, "steps": args.steps,
              "cluster": str(cluster_path), "span": max(predicted) / min(predicted), "repetitions": reps,
              "targets": {"median_abs_error": 0.15, "spearman": 0.8}}
    (OUT / "fidelity.json").write_text(json.dumps(result, indent=1))
    figure(reps, OUT / "fidelity.png")
    lines = [f"# Fidelity: {MODEL}, global batch {BATCH}, 2 ranks, {len(PLANS)} plans, {args.rounds} interleaved "
             f"rounds x {args.steps} steps, {args.repetitions} repetitions", "",
             f"predicted span {result['span']:.2f}x", "",
             "| repetition | median abs error | Spearman | target met |", "|---|---|---|---|"]
    for i, r in enumerate(reps):
        met = r["median_abs_error"] <= 0.15 and r["spearman"] >= 0.8
        lines.append(f"| {i + 1} | {r['median_abs_error']:.1%} | {r['spearman']:.2f} | {'yes' if met else 'no'} |")
    lines += ["", "| plan | predicted | " + " | ".join(f"measured {i + 1} (error)" for i in range(len(reps))) + " |",
              "|---|---|" + "---|" * len(reps)]
    for j, name in enumerate(PLANS):
        row = [f"{reps[0]['plans'][j]['predicted_s'] * 1e3:.1f} ms"]
        row += [f"{r['plans'][j]['measured_s'] * 1e3:.1f} ms ({r['plans'][j]['error']:+.0%})" for r in reps]
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def figure(reps, path: Path) -> None:
    fig, axes = plt.subplots(1, len(reps), figsize=(4.2 * len(reps), 4.2), squeeze=False)
    for ax, (i, r) in zip(axes[0], enumerate(reps), strict=True):
        pred = [p["predicted_s"] * 1e3 for p in r["plans"]]
        meas = [p["measured_s"] * 1e3 for p in r["plans"]]
        lo_err = [(p["measured_s"] - min(p["rounds_s"])) * 1e3 for p in r["plans"]]
        hi_err = [(max(p["rounds_s"]) - p["measured_s"]) * 1e3 for p in r["plans"]]
        ax.errorbar(pred, meas, yerr=[lo_err, hi_err], fmt="o", color="#1f77b4", ecolor="#999999", capsize=3)
        for p, x, y in zip(r["plans"], pred, meas, strict=True):
            ax.annotate(p["name"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        top = max(pred + meas) * 1.15
        ax.plot([0, top], [0, top], color="#444444", lw=0.8, label="measured = predicted")
        ax.fill_between([0, top], [0, top / 1.15], [0, top / 0.85], color="#2ca02c", alpha=0.12, label="within 15%")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_xlabel("predicted step (ms)")
        ax.set_ylabel("measured step (ms), median of rounds, min..max")
        ax.set_title(f"repetition {i + 1}: median |error| {r['median_abs_error']:.0%}, Spearman {r['spearman']:.2f}",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{MODEL} on this machine after paraplan calibrate: predicted against measured", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
