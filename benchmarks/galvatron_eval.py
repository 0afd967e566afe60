"""Galvatron-BMW Tables II and III, reproduced on paraplan's simulator.

Table II (../shared/papers/galvatron-bmw.md §VII-B): 8 x TITAN RTX (preset galvatron-8xtitan), the
eight models of Table I at 8/12/16/20 GB, every strategy the paper compares: the highest
throughput over batch sizes (multiples of 8) and its batch, OOM where nothing fits. Each cell is
`make_plan(request, planner)` with `batch_search = "best"` — the planner searches the batch — and
the throughput is the simulator's prediction of the chosen plan (the same number `paraplan plan`
prints). Costs are the analytic device model, overlap slowdown 1.0 (the CLI's default).

Table III-style: bert-huge-32 on the 16-A100 preset (2 nodes x 8, the paper's "high-performance
cluster") at 8 and 16 GB beside the paper's numbers, and llama2-7b on the 64-A100 preset at the
A100s' own 40 GB at batch 256 (no paper numbers: the paper has no Llama).

Writes $PARAPLAN_BENCH_OUT/galvatron_eval/{table2.json, table3.json, table2.md, table3.md,
table2.png} (default bench-out/). Cells are cached in the JSON as they finish, so an interrupted run
resumes. Run: .venv/bin/python benchmarks/galvatron_eval.py [--quick] [--jobs N] (quick: 16 GB and two
models).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

from paraplan.costs.memory_config import GIB
from paraplan.hardware import load_cluster
from paraplan.planners.registry import make_plan
from paraplan.planners.request import PlanRequest
from paraplan.workload import workload

OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "galvatron_eval"
MODELS = ("bert-huge-32", "bert-huge-48", "vit-huge-32", "vit-huge-48", "t5-large-32", "t5-large-48",
          "swin-huge-32", "swin-huge-48")
BUDGETS = (8, 12, 16, 20)
ROWS = (("dp", "PyTorch DDP (DP)"), ("tp", "Megatron (TP)"), ("pp", "PyTorch GPipe (PP)"),
        ("sdp", "FSDP/ZeRO-3 (SDP)"), ("deepspeed-3d", "DeepSpeed 3D"), ("dp+tp", "Galvatron (DP+TP)"),
        ("dp+pp", "Galvatron (DP+PP)"), ("galvatron", "Galvatron"), ("galvatron-base", "Galvatron-Base"),
        ("galvatron-1f1b-biobj", "Galvatron (1F1B+Bi-obj)"), ("galvatron-bmw", "Galvatron-BMW"))

# Table II as printed (throughput (batch)), the scan's misreadings fixed by hand ("572 (8)" is
# 5.72, "0OM" is OOM, "2545" is 25.45, "2397" 23.97, "547" 5.47, "535" 5.35, "1671" 16.71).
PAPER_TABLE2 = """
8 dp OOM OOM OOM OOM OOM OOM OOM OOM
8 tp OOM OOM 16.16(24) 10.65(16) OOM OOM 13.47(24) 8.41(8)
8 pp OOM OOM 20.57(56) 16.59(32) OOM OOM 23.61(40) 16.42(24)
8 sdp 4.65(8) OOM 33.25(64) 15.71(40) 5.97(8) OOM 24.86(48) 11.92(32)
8 deepspeed-3d 7.79(8) OOM 30.56(40) 14.59(16) 8.12(8) OOM 26.22(32) 14.27(16)
8 dp+tp OOM OOM 29.4(32) 15.76(16) OOM OOM 26.18(24) 14.76(16)
8 dp+pp OOM OOM 31.79(48) 20.93(24) 9.37(8) OOM 27.18(40) 17.71(24)
8 galvatron 8.16(8) OOM 36.58(56) 20.93(24) 9.37(8) OOM 31.33(48) 21.64(32)
8 galvatron-base 17.04(88) 9.99(72) 64.03(544) 35.89(512) 11.50(56) 6.87(56) 34.55(328) 25.69(292)
8 galvatron-1f1b-biobj 10.05(8) OOM 41.85(56) 23.10(40) 9.52(16) OOM 32.95(56) 22.25(48)
8 galvatron-bmw 19.06(184) 10.23(176) 71.57(568) 38.75(544) 20.74(80) 12.74(64) 65.34(360) 34.21(360)
12 dp OOM OOM 14.22(16) OOM OOM OOM OOM OOM
12 tp 5.72(8) OOM 16.71(48) 10.99(32) 5.14(8) OOM 13.68(40) 9.62(24)
12 pp 9.22(8) 6.2(8) 25.13(104) 16.62(64) 9.09(8) 6.83(8) 26.07(72) 19.82(48)
12 sdp 8.91(16) 3.15(8) 47.41(112) 24.24(72) 11.26(16) 4.11(8) 37.38(88) 21.98(64)
12 deepspeed-3d 7.79(8) 5.35(8) 37.88(80) 22.68(48) 8.12(8) 5.76(8) 34.14(72) 20.07(40)
12 dp+tp 8.92(8) 5.35(8) 42.21(64) 17.2(32) 9.53(8) OOM 37.26(56) 20.18(32)
12 dp+pp 9.22(8) 6.2(8) 50.69(72) 24.01(56) 11.95(16) 6.83(8) 35.87(56) 21.69(48)
12 galvatron 11.39(16) 6.2(8) 50.69(72) 26.63(72) 14.49(16) 6.83(8) 41.69(64) 25.42(64)
12 galvatron-base 18.66(72) 12.14(136) 68.46(568) 43.78(536) 20.66(80) 11.14(72) 58.56(360) 30.70(328)
12 galvatron-1f1b-biobj 15.20(32) 6.82(8) 54.92(104) 31.79(72) 15.24(24) 9.06(8) 57.73(136) 27.02(96)
12 galvatron-bmw 24.37(192) 15.97(192) 79.24(512) 46.94(568) 24.07(96) 15.13(80) 76.86(384) 47.78(376)
16 dp 6.39(8) OOM 44.40(64) OOM 7.79(8) OOM 28.61(40) OOM
16 tp 6.06(16) 3.88(8) 16.81(72) 11.02(40) 5.14(8) OOM 13.83(56) 9.71(40)
16 pp 12.96(16) 6.2(8) 25.26(144) 17.24(96) 9.09(8) 6.83(8) 28.23(104) 20.11(64)
16 sdp 12.47(24) 6.06(16) 59.93(160) 32.15(104) 14.95(24) 7.16(16) 49.68(136) 26.46(88)
16 deepspeed-3d 8.50(16) 5.35(8) 41.67(128) 25.45(72) 11.52(16) 5.76(8) 37.13(104) 24.12(64)
16 dp+tp 12.59(16) 6.19(8) 46.02(88) 23.97(48) 14.52(16) 6.84(8) 44.65(80) 26.51(48)
16 dp+pp 13.00(16) 6.2(8) 54.05(120) 28.01(56) 14.64(16) 6.83(8) 44.15(96) 25.82(56)
16 galvatron 15.05(24) 7.46(16) 63.25(160) 35.74(104) 16.50(24) 8.36(16) 54.06(136) 29.21(72)
16 galvatron-base 21.70(128) 12.92(96) 75.98(744) 45.75(656) 23.67(88) 15.69(80) 68.98(264) 41.15(360)
16 galvatron-1f1b-biobj 16.61(32) 10.03(32) 88.86(480) 39.39(104) 16.72(24) 9.69(16) 73.20(392) 39.34(136)
16 galvatron-bmw 27.90(224) 17.37(208) 89.22(520) 50.34(480) 26.75(128) 17.05(112) 84.52(428) 52.78(392)
20 dp 11.57(16) OOM 61.54(112) 17.02(32) 14.3(16) 5.43(8) 42.82(80) 11.8(24)
20 tp 6.06(16) 3.88(8) 16.11(88) 11.02(56) 5.47(16) 3.55(8) 13.84(72) 9.79(48)
20 pp 13.52(24) 7.05(16) 28.64(192) 17.96(128) 9.53(16) 8.13(16) 29.75(128) 20.73(88)
20 sdp 17.06(40) 7.8(24) 63.75(216) 38.29(136) 17.93(32) 7.16(16) 55.22(176) 32.63(120)
20 deepspeed-3d 8.50(16) 5.35(8) 43.36(168) 27.82(104) 13.14(24) 7.96(16) 40.60(136) 26.09(96)
20 dp+tp 14.65(24) 8.05(16) 61.54(112) 28.69(72) 15.35(24) 6.84(8) 54.87(104) 30.59(72)
20 dp+pp 15.52(24) 8.11(16) 61.54(112) 34.88(96) 17.27(24) 10.33(16) 50.19(136) 31.62(80)
20 galvatron 18.21(40) 8.95(24) 70.5(152) 41.2(136) 18.64(32) 10.33(16) 60.06(144) 37.75(120)
20 galvatron-base 22.57(160) 14.90(136) 77.96(1232) 52.06(800) 28.06(96) 16.33(96) 73.26(392) 47.43(520)
20 galvatron-1f1b-biobj 22.63(64) 11.16(32) 91.65(568) 51.07(480) 26.81(64) 11.45(24) 76.10(436) 51.20(360)
20 galvatron-bmw 29.08(256) 18.30(232) 95.59(592) 52.06(800) 29.28(152) 18.09(128) 87.23(512) 57.23(456)
"""
FIXED_BATCH = 256
TIE = 0.005  # throughputs within 0.5% are the same plan found by two variants, not a ranking
# Table III, high-performance cluster (16 A100), BERT-Huge-32 column
PAPER_TABLE3_BERT = {
    8: {"dp": None, "tp": None, "pp": (57.22, 16), "sdp": (27.75, 16), "deepspeed-3d": (85.38, 16), "dp+tp": None,
        "dp+pp": (74.80, 16), "galvatron": (99.17, 24), "galvatron-1f1b-biobj": (162.52, 96),
        "galvatron-base": (140.21, 144), "galvatron-bmw": (202.34, 296)},
    16: {"dp": (34.95, 16), "tp": (18.87, 16), "pp": (91.10, 40), "sdp": (113.98, 64), "deepspeed-3d": (133.67, 48),
         "dp+tp": (72.37, 32), "dp+pp": (135.48, 48), "galvatron": (147.26, 64),
         "galvatron-1f1b-biobj": (226.73, 192), "galvatron-base": (168.08, 376), "galvatron-bmw": (243.55, 416)},
}


def paper_table2() -> dict:
    """{budget: {planner: [(throughput, batch) or None per model]}}"""
    out: dict = {}
    for line in PAPER_TABLE2.strip().splitlines():
        budget, planner, *cells = line.split()
        assert len(cells) == len(MODELS), line
        parsed = [None if c == "OOM" else tuple(float(x) for x in re.fullmatch(r"([\d.]+)\((\d+)\)", c).groups())
                  for c in cells]
        out.setdefault(int(budget), {})[planner] = [None if p is None else (p[0], int(p[1])) for p in parsed]
    return out


def cell(cm, model: str, cluster: str, planner: str, budget_gib: int | None) -> dict:
    """The best-throughput batch (Table II's cells); on the 64-device preset the given FIXED_BATCH
    (a batch search there takes minutes per strategy on this machine)."""
    t0 = time.perf_counter()
    fixed = cm.cluster.n_devices >= 64
    request = PlanRequest(costs=cm, model_name=model, cluster_name=cluster, batch=FIXED_BATCH if fixed else 8,
                          memory_bytes=None if budget_gib is None else budget_gib * GIB,
                          options={} if fixed else {"batch_search": "best"})
    plan = make_plan(request, planner)
    p = plan.prediction
    return {"model": model, "planner": planner, "budget_gib": budget_gib, "feasible": p.feasible,
            "throughput": p.throughput_samples_per_s if p.feasible else 0.0, "batch": plan.global_batch,
            "stages": plan.n_stages, "micro_batches": plan.n_micro, "schedule": str(plan.schedule),
            "search_s": time.perf_counter() - t0}


_COST_MODELS: dict = {}  # (cluster, model) -> CostModel; module-level so forked workers inherit it


def _run_job(job: tuple) -> dict:
    cluster, model, planner, budget = job
    return {**cell(_COST_MODELS[(cluster, model)], model, cluster, planner, budget), "cluster": cluster}


def run_cells(path: Path, jobs: list[tuple], cms: dict, workers: int = 1) -> list[dict]:
    """Every job not already in `path`, `workers` processes at a time (search time is measured per
    cell, so with more than one worker it includes the machine being shared); the cells in the order
    of `jobs`."""
    done = json.loads(path.read_text())["cells"] if path.exists() else []
    have = {(c["cluster"], c["model"], c["planner"], c["budget_gib"]) for c in done}
    todo = [j for j in jobs if j not in have]
    _COST_MODELS.update(cms)
    if workers > 1:
        import multiprocessing

        pool = multiprocessing.get_context("fork").Pool(workers)
        results = pool.imap_unordered(_run_job, todo)
    else:
        pool, results = None, map(_run_job, todo)
    for i, c in enumerate(results):
        done.append(c)
        print(f"[{i + 1}/{len(todo)}] {c['cluster']} {c['model']} {c['budget_gib']} GB {c['planner']}: "
              + (f"{c['throughput']:.2f} samples/s at batch {c['batch']}" if c["feasible"] else "OOM")
              + f" ({c['search_s']:.1f} s)", flush=True)
        path.write_text(json.dumps({"cells": done}, indent=1))
    if pool is not None:
        pool.close()
    # the jobs' order, whatever order the workers (or an earlier, resumed run) finished them in
    order = {j: i for i, j in enumerate(jobs)}
    done.sort(key=lambda c: order.get((c["cluster"], c["model"], c["planner"], c["budget_gib"]), len(order)))
    return done


def _fmt(throughput_batch) -> str:
    return "OOM" if throughput_batch is None else f"{throughput_batch[0]:.2f} ({throughput_batch[1]})"


def markdown_table2(cells: list[dict], models, budgets) -> str:
    paper = paper_table2()
    ours = {(c["model"], c["planner"], c["budget_gib"]): c for c in cells}
    lines = ["| memory | strategy | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for budget in budgets:
        for planner, label in ROWS:
            row = []
            for model in models:
                c = ours.get((model, planner, budget))
                mine = "—" if c is None else _fmt((c["throughput"], c["batch"]) if c["feasible"] else None)
                row.append(f"{mine} / {_fmt(paper[budget][planner][MODELS.index(model)])}")
            lines.append(f"| {budget} GB | {label} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def ranking_summary(cells: list[dict], models, budgets) -> dict:
    """Per (model, budget): does our best strategy match the paper's, and how many of the 55 pairs of
    strategies are ordered alike (Kendall-style agreement on throughput, OOM = 0)."""
    paper = paper_table2()
    ours = {(c["model"], c["planner"], c["budget_gib"]): c["throughput"] for c in cells}
    out = []
    names = [p for p, _ in ROWS]
    for budget in budgets:
        for model in models:
            j = MODELS.index(model)
            mine = {p: ours.get((model, p, budget)) for p in names}
            if any(v is None for v in mine.values()):
                continue
            theirs = {p: (paper[budget][p][j] or (0.0, 0))[0] for p in names}
            agree = total = 0
            for a in range(len(names)):
                for b in range(a + 1, len(names)):
                    x, y = names[a], names[b]
                    if theirs[x] == theirs[y] or abs(mine[x] - mine[y]) <= TIE * max(mine[x], mine[y]):
                        continue
                    total += 1
                    agree += (theirs[x] > theirs[y]) == (mine[x] > mine[y])
            top = max(mine.values())
            ours_best = [p for p in names if top and mine[p] >= top * (1 - TIE)]  # ties: within TIE of the best
            out.append({"model": model, "budget_gib": budget, "our_best": ours_best,
                        "paper_best": max(names, key=theirs.get), "pairs_agree": agree, "pairs": total,
                        "bmw_over_best_baseline": mine["galvatron-bmw"] / max(
                            (mine[p] for p in names if not p.startswith("galvatron")), default=1.0) if any(
                            mine[p] for p in names if not p.startswith("galvatron")) else None})
    return {"per_cell": out, "pairs_agree": sum(r["pairs_agree"] for r in out), "pairs": sum(r["pairs"] for r in out),
            "same_best": sum(r["paper_best"] in r["our_best"] for r in out), "cells": len(out)}


def figure(cells: list[dict], models, budgets, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paper = paper_table2()
    fig, axes = plt.subplots(len(budgets), len(models), figsize=(3.0 * len(models), 2.6 * len(budgets)),
                             squeeze=False)
    names = [p for p, _ in ROWS]
    ours = {(c["model"], c["planner"], c["budget_gib"]): c for c in cells}
    for r, budget in enumerate(budgets):
        for k, model in enumerate(models):
            ax = axes[r][k]
            mine = [ours[(model, p, budget)]["throughput"] if (model, p, budget) in ours else 0 for p in names]
            theirs = [(paper[budget][p][MODELS.index(model)] or (0, 0))[0] for p in names]
            x = range(len(names))
            ax.bar([i - 0.2 for i in x], theirs, width=0.4, label="paper (real TITANs)", color="#999999")
            ax.bar([i + 0.2 for i in x], mine, width=0.4, label="paraplan (simulated)", color="#1f77b4")
            ax.set_xticks(list(x))
            ax.set_xticklabels(names, rotation=90, fontsize=6)
            ax.tick_params(axis="y", labelsize=7)
            ax.set_title(f"{model}, {budget} GB", fontsize=8)
            if k == 0:
                ax.set_ylabel("samples/s", fontsize=7)
    axes[0][0].legend(fontsize=6)
    fig.suptitle("Galvatron-BMW Table II: best throughput per strategy, paper (grey) vs our simulator (blue); "
                 "0 = OOM", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    parser = bench_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help="16 GB, bert-huge-32 and vit-huge-32 only")
    parser.add_argument("--no-table3", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    args = parser.parse_args()
    models = ("bert-huge-32", "vit-huge-32") if args.quick else MODELS
    budgets = (16,) if args.quick else BUDGETS
    OUT.mkdir(parents=True, exist_ok=True)
    cms = {}
    titan = load_cluster("galvatron-8xtitan")
    for model in models:
        cms[("galvatron-8xtitan", model)] = workload(model, titan).costs  # one request per cell over them
    jobs = [("galvatron-8xtitan", m, p, b) for b in budgets for m in models for p, _ in ROWS]
    cells = run_cells(OUT / "table2.json", jobs, cms, args.jobs)
    summary = ranking_summary(cells, models, budgets)
    (OUT / "table2.json").write_text(json.dumps({"cells": cells, "ranking": summary}, indent=1))
    md = [markdown_table2(cells, models, budgets), "",
          f"ours / paper: best throughput in samples/s (its batch). The paper's best strategy is (one of) ours in "
          f"{summary['same_best']} of {summary['cells']} (model, memory) cells; pairs of strategies "
          f"ordered alike: {summary['pairs_agree']} of {summary['pairs']} (pairs within 0.5% in ours or equal "
          f"in the paper's left out)."]
    (OUT / "table2.md").write_text("\n".join(md) + "\n")
    figure(cells, models, budgets, OUT / "table2.png")
    print("\n".join(md))
    if args.no_table3:
        return
    jobs3 = []
    for cluster_name, model, budgets3 in (("galvatron-16xa100", "bert-huge-32", (8, 16)),
                                          ("galvatron-64xa100", "llama2-7b", (None,))):
        if (cluster_name, model) not in cms:
            cms[(cluster_name, model)] = workload(model, cluster_name).costs
        jobs3 += [(cluster_name, model, p, b) for b in budgets3 for p, _ in ROWS]
    wanted = set(jobs3)
    cells3 = [c for c in run_cells(OUT / "table3.json", jobs3, cms, args.jobs)
              if (c["cluster"], c["model"], c["planner"], c["budget_gib"]) in wanted]
    (OUT / "table3.json").write_text(json.dumps({"cells": cells3}, indent=1))
    lines = ["| cluster | model | memory | strategy | ours | paper |", "|---|---|---|---|---|---|"]
    for c in cells3:
        theirs = PAPER_TABLE3_BERT.get(c["budget_gib"], {}).get(c["planner"], "—") if c["model"] == "bert-huge-32" \
            else "—"
        theirs = theirs if theirs == "—" else _fmt(theirs)
        lines.append(f"| {c['cluster']} | {c['model']} | {c['budget_gib'] or 40} GB | {c['planner']} | "
                     f"{_fmt((c['throughput'], c['batch']) if c['feasible'] else None)} | {theirs} |")
    (OUT / "table3.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
