"""How fast the CSIMD planner is: `csimd_search.search` as `pipeline_split.solve` calls it (the default,
SearchMethod.AUTO, every divisor of a batch of 512 as candidate p), for K in (10 .. 1,000) layers
x N in (4 .. 64) stages; goal: under 5 s everywhere. Also the explicit exact mode
(SearchMethod.EXACT_TIME: no work limit) and, to show what the bound across p saves, today's
`exact_time` for every candidate p on its own (the shape of the old default, which ran its exact
search for every p), each stopped at CAP_S.

Instances are analytic-looking: per-layer times a + b x micro-batch with +-50 % (a) and +-30 % (b)
variation, heavier first and last layers, backward about twice forward, activations and
gradients sent at about 0.3x the compute slope. A stress set makes the per-micro-batch overhead
large (10 ms a layer) and communication heavy (3x), so that the best p is small and cut
communication matters: where AUTO may hit its work limit.

Writes bench-out/planner_speed/csimd.json and csimd.png (`make results`: results/planner_speed/).
Run: .venv/bin/python benchmarks/planner_speed_csimd.py
"""

from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from paraplan.planners import stage_division  # noqa: E402
from paraplan.planners.csimd import search as csimd_search  # noqa: E402
from paraplan.planners.csimd.search import SearchMethod  # noqa: E402

GOAL_S = 5.0
CAP_S = 60.0  # the exact modes stop here; a capped cell is reported as "> CAP_S"
BATCH = 512
LAYERS = (10, 30, 100, 300, 1000)
STAGES = (4, 8, 16, 32, 64)
STRESS = ((300, 64), (1000, 16), (1000, 32), (1000, 64))
OUT = Path(os.environ.get("PARAPLAN_BENCH_OUT", "bench-out")) / "planner_speed"


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def instance(n_layers: int, seed: int, overhead_s: float = 40e-6, comm_ratio: float = 0.3):
    """(h_p, h_m, j_p, j_m) as (candidates x K) arrays at micro-batch size BATCH / p, and the p."""
    rng = np.random.default_rng(seed)
    ps = divisors(BATCH)
    micro = BATCH / np.array(ps, float)[:, None]
    fixed = overhead_s * rng.uniform(0.5, 1.5, n_layers)
    slope = 1e-4 * rng.uniform(0.7, 1.3, n_layers)
    slope[0] *= 3  # embedding
    slope[-1] *= 4  # head
    comm_fixed = overhead_s * rng.uniform(0.3, 0.8, n_layers)
    comm_slope = comm_ratio * 1e-4 * rng.uniform(0.5, 1.5, n_layers)
    h_p = fixed + slope * micro
    j_p = 1.1 * fixed + 2.0 * slope * micro
    h_m = comm_fixed + comm_slope * micro
    j_m = comm_fixed + comm_slope * rng.uniform(0.8, 1.2, n_layers) * micro
    j_m[:, 0] = 0.0  # nothing to send back from the first layer
    return (h_p, h_m, j_p, j_m), ps


class _Capped(Exception):
    pass


def _alarm(signum, frame):
    raise _Capped


def timed(call, cap_s: float | None = None):
    """(seconds, result), or (None, None) when it ran past cap_s."""
    if cap_s is not None:
        signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, cap_s)
    t0 = time.perf_counter()
    try:
        result = call()
    except _Capped:
        return None, None
    finally:
        if cap_s is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
    return time.perf_counter() - t0, result


def describe(r: csimd_search.CrossSearchResult) -> dict:
    return {"time_s": r.time_s, "n_micro": r.n_micro, "n_stages_used": len(r.cuts) + 1, "exact": r.exact,
            "lower_bound_s": r.lower_bound_s, "gap_bound": (r.time_s - r.lower_bound_s) / r.time_s,
            "exact_searches": r.iterations}


def per_p_exact(q, ps, n_stages: int) -> float:
    """exact_time for every candidate p on its own, the best T (the old default's exact work)."""
    return min(stage_division.total_time(*(x[r] for x in q), csimd_search.exact_time(*(x[r] for x in q), n_stages, p), p)
               for r, p in enumerate(ps))


def measure(n_layers: int, n_stages: int, seed: int, per_p: bool, repeats: int = 3, **shape) -> dict:
    q, ps = instance(n_layers, seed, **shape)
    runs = [timed(lambda: csimd_search.search(*q, ps, n_stages)) for _ in range(repeats)]
    auto = runs[0][1]
    row = {"n_layers": n_layers, "n_stages": n_stages, "seed": seed,
           "auto_s": statistics.median(t for t, _ in runs), "auto": describe(auto)}
    exact_s, exact = timed(lambda: csimd_search.search(*q, ps, n_stages, method=SearchMethod.EXACT_TIME), CAP_S)
    row["exact_s"] = exact_s
    if exact is not None:
        row["exact"] = describe(exact)
        row["auto_over_exact"] = auto.time_s / exact.time_s
    if per_p:
        row["per_p_exact_s"], _ = timed(lambda: per_p_exact(q, ps, n_stages), CAP_S)
    return row


def fmt(seconds: float | None) -> str:
    return f"> {CAP_S:.0f}" if seconds is None else f"{seconds:.2f}"


def plot(grid: list[dict], stress: list[dict], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8), sharey=True)
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(STAGES)))
    for n, colour in zip(STAGES, colours, strict=True):
        rows = [r for r in grid if r["n_stages"] == n]
        ks = [r["n_layers"] for r in rows]
        left.plot(ks, [r["auto_s"] for r in rows], "o-", color=colour, label=f"N = {n}")
        for key, style in (("exact_s", "s-"), ("per_p_exact_s", "^--")):
            done = [(r["n_layers"], r[key]) for r in rows if r.get(key) is not None]
            capped = [r["n_layers"] for r in rows if key in r and r[key] is None]
            if done:
                right.plot(*zip(*done, strict=True), style, color=colour,
                           label=f"N = {n}" if key == "exact_s" else None)
            if capped:
                right.plot(capped, [CAP_S] * len(capped), "x", color=colour, markersize=9)
    for r in stress:
        left.plot(r["n_layers"], r["auto_s"], "*", color="red" if not r["auto"]["exact"] else "black", markersize=11)
        left.annotate(f"N={r['n_stages']}" + ("" if r["auto"]["exact"] else " (not exact)"),
                      (r["n_layers"], r["auto_s"]), textcoords="offset points", xytext=(-8, 6), ha="right", fontsize=7)
    left.plot([], [], "k*", markersize=11, label="stress: 10 ms overhead, 3x comm")
    left.axhline(GOAL_S, color="red", linestyle=":", label=f"goal {GOAL_S:.0f} s")
    right.axhline(CAP_S, color="grey", linestyle=":", label=f"cap {CAP_S:.0f} s (x: stopped)")
    right.plot([], [], "k^--", label="exact_time for each p alone")
    right.plot([], [], "ks-", label="search(exact-time)")
    left.set_title(f"default search (AUTO), every divisor of {BATCH} as p")
    right.set_title("exact modes")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("layers K")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    left.set_ylabel("planner time (s), 2-core machine")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    from _paraplan_cli import bench_parser

    bench_parser(__doc__).parse_args()
    load_before = os.getloadavg()[0]  # other work on this 2-core machine slows every number here
    grid = []
    for n in STAGES:
        per_p = True  # once exact_time per p hits the cap at some K, larger K at this N are skipped
        for k in LAYERS:
            row = measure(k, n, seed=1000 * k + n, per_p=per_p)
            per_p = per_p and row.get("per_p_exact_s") is not None
            grid.append(row)
            print(f"K={k:5d} N={n:3d}: auto {row['auto_s']:.2f} s (exact={row['auto']['exact']}, "
                  f"p={row['auto']['n_micro']}), exact-time {fmt(row['exact_s'])} s, "
                  f"exact_time per p {fmt(row.get('per_p_exact_s')) if 'per_p_exact_s' in row else 'skipped'} s",
                  flush=True)
    stress = []
    for k, n in STRESS:
        row = measure(k, n, seed=7 * k + n, per_p=False, repeats=1, overhead_s=10e-3, comm_ratio=3.0)
        stress.append(row)
        print(f"stress K={k:5d} N={n:3d}: auto {row['auto_s']:.2f} s (exact={row['auto']['exact']}, gap bound "
              f"{row['auto']['gap_bound']:.2%}, actual {row.get('auto_over_exact', float('nan')) - 1:.3%}), "
              f"exact-time {fmt(row['exact_s'])} s", flush=True)
    worst = max(r["auto_s"] for r in grid + stress)
    out = {"version": 1, "goal_s": GOAL_S, "cap_s": CAP_S, "meets_goal": worst < GOAL_S, "worst_auto_s": worst,
           "batch": BATCH, "n_micro_values": divisors(BATCH), "auto_max_work": csimd_search.AUTO_MAX_WORK,
           "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
           "python": platform.python_version(), "load_avg_1min": [load_before, os.getloadavg()[0]],
           "grid": grid, "stress": stress}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "csimd.json").write_text(json.dumps(out, indent=2))
    plot(grid, stress, OUT / "csimd.png")
    print(f"worst default search {worst:.2f} s: goal under {GOAL_S:.0f} s {'met' if out['meets_goal'] else 'MISSED'}")


if __name__ == "__main__":
    main()
