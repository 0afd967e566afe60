"""`paraplan plan --try-top K` and `--prove`: the comparison's best plans run for real on this
machine (runtime/launcher/prove.py), predicted against measured."""

from __future__ import annotations


def try_top(result, args, err):
    """--try-top K: the K best predicted distinct plans run for real, interleaved; the measured best
    (runtime/launcher/prove.py: measured_best) and a table of predicted against measured. Returns the chosen
    row (None when fewer than two distinct plans fit)."""
    from rich.table import Table

    from paraplan.report.tables import console
    from paraplan.runtime.launcher.prove import measured_best

    rows = result.distinct(args.try_top)  # fastest predicted first; plans two planners share are run once
    if len(rows) < 2:
        console().print("--try-top: fewer than two distinct plans fit; the predicted best is written")
        return None
    by_name = {f"{i + 1}. {r.planner}": r for i, r in enumerate(rows)}
    with err.status("trying the best plans for real") as status:
        chosen, measured = measured_best({name: (r.plan, r.iteration_s) for name, r in by_name.items()},
                                         args.prove_rounds, args.prove_steps,
                                         progress=lambda text: status.update(f"trying the best plans: {text}"))
    table = Table(title="the best predicted plans, run on this machine (median of rounds, min..max)")
    for col in ("plan (predicted rank)", "predicted", "measured", "measured / predicted"):
        table.add_column(col, justify="left" if col.startswith("plan") else "right")
    for m in measured:
        table.add_row(m.name + ("  <- chosen" if m.name == chosen else ""), f"{m.predicted_s * 1e3:.1f} ms",
                      f"{m.median_s * 1e3:.1f} ms ({min(m.rounds_s) * 1e3:.1f}..{max(m.rounds_s) * 1e3:.1f})",
                      m.ratio)
    out = console()
    out.print(table)
    first = measured[0]
    best = next(m for m in measured if m.name == chosen)
    out.print(f"measured best: {chosen} ({first.median_s / best.median_s:.2f}x the predicted best's step)"
              if best is not first else f"measured best: {chosen}, the predicted best")
    out.print(f"plan written to {args.out}")
    return by_name[chosen]


def prove_best(best, request, err, args):
    """The chosen plan, the even split over every device and one process, run for real (runtime/launcher/prove.py)."""
    from dataclasses import replace

    from paraplan.planners.registry import make_plan
    from paraplan.runtime.launcher.prove import one_process_plan, run_interleaved
    from paraplan.simulator.predict import simulate_plan

    cm = request.costs
    n = cm.cluster.n_devices
    plans = {f"chosen ({best.planner})": best.plan}
    if n > 1:
        even = make_plan(replace(request, n_stages=min(n, cm.model.n_layers), n_micro=None, exact_stages=True),
                         "even")
        plans[f"even split ({even.n_stages} stages)"] = even
    plans["one process"] = one_process_plan(best.plan)
    judged = {name: (plan, simulate_plan(plan, cm).prediction.iteration_s) for name, plan in plans.items()}
    with err.status("running the plans for real") as status:
        return run_interleaved(judged, args.prove_rounds, args.prove_steps,
                               progress=lambda text: status.update(f"running the plans for real: {text}"))


# above this 1-minute load average (beside the runs' own ranks) the comparison measures the other work too
BUSY_LOAD = 1.5


def load_average() -> float:
    import os

    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def print_proof(proof, chosen: str, load_before: float = float("nan")) -> None:
    from rich.table import Table

    from paraplan.report.tables import console

    table = Table(title="proof on this machine: predicted against measured (median of rounds, min..max)")
    for col in ("plan", "predicted", "measured", "measured / predicted", "chosen is faster by"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    first = proof[0]
    for m in proof:
        speedup = "" if m is first else f"{m.median_s / first.median_s:.2f}x"
        table.add_row(m.name, f"{m.predicted_s * 1e3:.1f} ms",
                      f"{m.median_s * 1e3:.1f} ms ({min(m.rounds_s) * 1e3:.1f}..{max(m.rounds_s) * 1e3:.1f})",
                      m.ratio, speedup)
    out = console()
    out.print(table)
    fastest_measured = min(proof, key=lambda m: m.median_s)
    fastest_predicted = min(proof, key=lambda m: m.predicted_s)
    if fastest_measured is first:
        out.print(f"the chosen plan ({chosen}) is the fastest measured: "
                  + ", ".join(f"{m.median_s / first.median_s:.2f}x faster than {m.name}" for m in proof[1:]))
    else:
        out.print(f"measured, {fastest_measured.name} is faster than the chosen plan "
                  f"({first.median_s / fastest_measured.median_s:.2f}x); the prediction ranked "
                  f"{fastest_predicted.name} first")
    for line in proof_verdict(proof, load_before):
        out.print(line)


def proof_verdict(proof, load_before: float) -> list[str]:
    """What the proof says about this machine, plainly: when one process was the fastest measured,
    that splitting this model does not pay here; the load average before the runs, and when it was
    high enough that the timings measured other work too."""
    import math
    import os

    lines = []
    fastest = min(proof, key=lambda m: m.median_s)
    if fastest.name == "one process":
        lines.append("this machine cannot gain from splitting this model: one process was the fastest measured")
    if not math.isnan(load_before):
        cores = os.cpu_count() or 1
        line = f"load average {load_before:.2f} on {cores} cores before the runs"
        if load_before > BUSY_LOAD:
            line += (f": above {BUSY_LOAD}, other work shared the cores, so these timings say little about this "
                     "machine idle; run it again when it is quiet")
        lines.append(line)
    return lines
