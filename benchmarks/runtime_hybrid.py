"""Measured against predicted for plans with per-layer strategies (Runtime II): one plan of each
Galvatron strategy family for tiny GPT-2 on 2 gloo ranks (the planners `dp`, `sdp`, `tp`, `pp`,
`galvatron-bmw`, and DP with every block checkpointed), run for real and simulated with a measured
profile. The plans run interleaved (A B C ... A B C ...) for ROUNDS rounds, so that this machine's
drift falls on all of them alike; the spread over the rounds is reported.

Writes bench-out/runtime_hybrid/{runs.json, summary.md, predicted_vs_measured.png}
(`make results`: results/runtime_hybrid/).
Run: .venv/bin/python benchmarks/runtime_hybrid.py [--rounds 3] [--steps 8]
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _paraplan_cli import bench_parser, cli  # noqa: E402  (benchmarks/: shared with the other runtime benchmarks)

from paraplan.costs.memory import plan_memory  # noqa: E402
from paraplan.planners.registry import make_plan  # noqa: E402
from paraplan.planners.request import PlanRequest  # noqa: E402
from paraplan.plans.plan import LayerStrategy  # noqa: E402
from paraplan.plans.plan_file import write_plan  # noqa: E402
from paraplan.runtime.measure.compare import memory_comparison, read_overheads  # noqa: E402
from paraplan.simulator.predict import simulate_plan  # noqa: E402
from paraplan.workload import workload  # noqa: E402

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "runtime_hybrid"
MODEL = "gpt2-tiny"
BATCH = 16
WARMUP_STEPS = 2
PLANNERS = ("dp", "sdp", "tp", "pp", "galvatron-bmw")



def plans(cm) -> dict:
    out = {}
    for name in PLANNERS:
        schedule = "1f1b" if name.startswith("galvatron") else "gpipe"  # the baselines plan GPipe (the paper's)
        request = PlanRequest(costs=cm, model_name=MODEL, cluster_name="local", batch=BATCH, schedule=schedule)
        out[name] = make_plan(request, name)
    dp = out["dp"]
    stage = dp.stages[0]
    checkpointed = tuple(replace(s, recompute="none" if i in (0, len(stage.strategies) - 1) else "full")
                         for i, s in enumerate(stage.strategies or (LayerStrategy(dp=2),) * dp.n_layers))
    out["dp + ckpt"] = replace(dp, stages=(replace(stage, strategies=checkpointed),), prediction=None, search=None)
    return out


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    profile_path = OUT / "profile.json"
    if not profile_path.exists():
        cli("profile", MODEL, "--batch-sizes", "1,2,4,8,16", "--repeats", "15", "--out", str(profile_path))
    w = workload(MODEL, "local", profile=profile_path, overheads=read_overheads())
    spec, cm = w.spec, w.costs
    todo = plans(cm)  # one request per planner (their schedules differ) over the same costs
    measured: dict[str, list[float]] = {name: [] for name in todo}
    memory: dict[str, list] = {}
    for r in range(args.rounds):
        for name, plan in todo.items():
            path = OUT / "plan.json"
            write_plan(plan, path)
            run_dir = OUT / "run"
            shutil.rmtree(run_dir, ignore_errors=True)
            cli("train", "--plan", str(path), "--steps", str(args.steps), "--out-dir", str(run_dir))
            ranks = [json.loads(f.read_text()) for f in sorted(run_dir.glob("steps_rank*.json"))]
            per_step = [max(x[i] for x in ranks) for i in range(args.steps)][WARMUP_STEPS:]
            measured[name].append(statistics.median(per_step))
            if r == 0:
                _, breakdowns = plan_memory(plan, spec, {d: 2**34 for d in plan.devices}, device_kind="cpu-core")
                memory[name] = [vars(m) for m in memory_comparison(breakdowns, run_dir)]
            print(f"round {r + 1}: {name:14s} {measured[name][-1] * 1e3:7.1f} ms", flush=True)
    rows = []
    for name, plan in todo.items():
        predicted = simulate_plan(plan, cm).prediction.iteration_s
        runs = measured[name]
        median = statistics.median(runs)
        rows.append({"plan": name, "strategies": _describe(plan), "measured_s": median, "min_s": min(runs),
                     "max_s": max(runs), "predicted_s": predicted, "error": median / predicted - 1,
                     "memory": memory[name]})  # error: measured against predicted
    (OUT / "runs.json").write_text(json.dumps({"model": MODEL, "batch": BATCH, "rounds": args.rounds,
                                               "steps": args.steps, "rows": rows}, indent=1))
    _figure(rows)
    lines = ["# Plans with per-layer strategies: measured against predicted", "",
             f"{MODEL}, global batch {BATCH}, 2 gloo ranks with one thread each on this machine; each plan "
             f"{args.steps} steps (the first {WARMUP_STEPS} dropped) in each of {args.rounds} interleaved rounds; "
             "predicted with a measured profile, the `local` preset's links and the shipped runtime overheads.", "",
             "| plan | strategies | measured median of rounds (min..max) | predicted | error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['plan']} | {r['strategies']} | {r['measured_s'] * 1e3:.1f} ms ({r['min_s'] * 1e3:.1f}.."
                     f"{r['max_s'] * 1e3:.1f}) | {r['predicted_s'] * 1e3:.1f} ms | {r['error']:+.1%} |")
    lines += ["", "Memory per rank (rank 0; MiB): states = parameters + gradients + optimizer states, activations = "
              "the peak of what autograd keeps, measured on the last step.", "",
              "| plan | states measured | predicted | activations measured | predicted |", "|---|---|---|---|---|"]
    for r in rows:
        m = r["memory"][0]
        lines.append(f"| {r['plan']} | {m['measured_states'] / 2**20:.2f} | {m['predicted_states'] / 2**20:.2f} | "
                     f"{m['measured_activations'] / 2**20:.2f} | {m['predicted_activations'] / 2**20:.2f} |")
    (OUT / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _describe(plan) -> str:
    from paraplan.report.describe import describe_strategies

    return "; ".join(describe_strategies(plan))


def _figure(rows) -> None:
    fig, ax = plt.subplots(figsize=(6, 5))
    for i, r in enumerate(rows):
        ax.errorbar(r["measured_s"] * 1e3, r["predicted_s"] * 1e3,
                    xerr=[[(r["measured_s"] - r["min_s"]) * 1e3], [(r["max_s"] - r["measured_s"]) * 1e3]], fmt="o",
                    label=f"{r['plan']}: {r['error']:+.0%}")
        # labels alternate above and below: plans with the same prediction (bmw = dp here) stay legible
        ax.annotate(r["plan"], (r["measured_s"] * 1e3, r["predicted_s"] * 1e3), fontsize=8,
                    xytext=(4, 6 if i % 2 == 0 else -12), textcoords="offset points")
    ax.legend(fontsize=7, loc="upper left", title="error of the prediction", title_fontsize=7)
    top = max(max(r["max_s"], r["predicted_s"]) for r in rows) * 1e3 * 1.15
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    for k in (0.85, 1.15):
        ax.plot([0, top], [0, top * k], color="grey", linewidth=0.5, linestyle=":")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured step (ms): median of rounds, bar = min..max")
    ax.set_ylabel("predicted (ms)")
    ax.set_title(f"{MODEL}, batch {BATCH}, 2 gloo ranks: per-layer strategies; dotted ±15%", fontsize=9)
    fig.tight_layout()
    fig.savefig(OUT / "predicted_vs_measured.png", dpi=120)


if __name__ == "__main__":
    main()
