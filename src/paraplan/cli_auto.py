"""`paraplan plan --planner auto` (the default): every method on the same request, one table, the
best feasible plan written, the lower bound and the winner's gap to it (paraplan/auto.py)."""

from __future__ import annotations

import json

from paraplan.errors import ParaplanError


def cmd_plan_auto(args, given: dict) -> int:
    from paraplan.auto import compare
    from paraplan.cli import _cost_model, _measured_model
    from paraplan.cli_args import _check_output, _check_plan_sizes, _flags_in
    from paraplan.hardware import load_cluster
    from paraplan.plan.plan_file import plan_to_dict, write_plan
    from paraplan.planners.request import PlanRequest
    from paraplan.report import auto_table, console

    if args.batch in ("max", "best"):
        raise ParaplanError(f"--batch {args.batch}: the comparison of every planner is at a given batch; the "
                            "Galvatron planners search it (e.g. --planner galvatron-bmw --batch max)")
    for k, v in given.items():
        if v is not None:
            raise ParaplanError(f"--{k}: an option of one planner; give --planner too")
    if args.time_limit is not None and not args.time_limit > 0:
        raise ParaplanError(f"--time-limit: must be positive, got {args.time_limit}")
    _check_plan_sizes(args)
    _check_output("--out", args.out)
    if args.report:
        _check_output("--report", args.report, directory=True)
    cluster = load_cluster(args.cluster)
    if args.prove:
        from paraplan.prove import check_runs_here

        check_runs_here(cluster.n_devices, args.cluster)
        if args.prove_steps <= 2 or args.prove_rounds < 1:
            raise ParaplanError("--prove-steps must be more than 2 (the first two are warm-up) and --prove-rounds "
                                f"positive; got {args.prove_steps} and {args.prove_rounds}")
    err = console(stderr=True)
    with err.status(f"measuring {args.model} on meta"):
        built, spec = _measured_model(args.model, args.seq_len, args.image_size, args.layers)
    graph = None
    try:
        from paraplan.models.op_trace import build_op_graph

        with err.status("tracing the operator graph (for the operator-placement planners)"):
            graph = build_op_graph(built)
    except ParaplanError:
        graph = None  # their rows say they were skipped, and why
    cm = _cost_model(args, spec, cluster, operators=graph)
    request = PlanRequest(costs=cm, model_name=built.ref, cluster_name=args.cluster, batch=args.batch,
                          n_stages=args.stages, n_micro=args.micro_batches, schedule=args.schedule,
                          memory_bytes=None if args.memory_gib is None else int(args.memory_gib * 2**30),
                          exact_stages=args.exact_stages)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from paraplan.planners.registry import planner_names

    total = len(planner_names())
    with Progress(TextColumn("comparing planners"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True,
                  disable=args.json) as progress:
        task = progress.add_task("", total=total)

        def on_row(row) -> None:
            progress.update(task, advance=1, description=f"{row.planner}: {row.status}")

        result = compare(request, time_limit_s=args.time_limit or 60.0, on_row=on_row)
    best = result.row(result.best) if result.best else None
    if best is not None:
        write_plan(best.plan, args.out)
    if args.report:
        from paraplan.report_html import write_report

        write_report(result, request.costs, args.report)  # its memory budget included, as the rows were judged
    gap = best.iteration_s / result.bound.iteration_s - 1 if best is not None else None
    if args.json:
        print(json.dumps(auto_json(result, args.out if best else None, gap, plan_to_dict), indent=2))
    else:
        out = console()
        out.print(auto_table(result, f"{built.ref} on {args.cluster}, global batch {args.batch}"))
        b = result.bound
        out.print(f"lower bound {b.iteration_s * 1e3:.4g} ms: the least forward + backward work "
                  f"({b.work_s * 1e3:.4g} device-ms, every layer at its cheapest piece size) spread over "
                  f"{b.n_devices} devices; the whole batch on one device takes {b.one_device_s * 1e3:.4g} ms")
        if best is not None:
            out.print(f"best: {best.planner} ({best.shape}), {best.iteration_s * 1e3:.4g} ms per iteration, "
                      f"{best.throughput:.4g} samples/s, {gap:+.1%} above the lower bound; compared "
                      f"{sum(r.status in ('ok', 'infeasible') for r in result.rows)} plans in {result.wall_s:.1f} s; "
                      f"plan written to {args.out}")
            if best.plan.search and best.plan.search.note:
                out.print(_flags_in(best.plan.search.note))
        if args.report:
            out.print(f"report written to {args.report}/index.html")
    if best is not None and args.prove:
        proof = prove_best(best, request, err, args)
        if not args.json:
            print_proof(proof, best.planner)
    if best is None:
        failed = [r for r in result.rows if r.status == "infeasible"]
        closest = min(failed, key=lambda r: r.iteration_s) if failed else None
        raise ParaplanError("no planner found a plan that fits" + (
            f"; the fastest, {closest.planner}: {closest.reason}" if closest else ""))
    return 0


def auto_json(result, out: str | None, gap: float | None, plan_to_dict) -> dict:
    """The stable schema of `paraplan plan --planner auto --json` (version 1)."""
    return {
        "schema": "paraplan.plan.auto/1",
        "best": result.best, "out": out, "gap_to_bound": gap, "wall_s": result.wall_s,
        "lower_bound": {"iteration_s": result.bound.iteration_s, "work_s": result.bound.work_s,
                        "one_device_s": result.bound.one_device_s, "n_devices": result.bound.n_devices},
        "rows": [{"planner": r.planner, "status": r.status, "shape": r.shape,
                  "n_micro": r.plan.n_micro if r.plan else None, "iteration_s": r.iteration_s,
                  "throughput_samples_per_s": r.throughput, "peak_bytes": list(r.peak_bytes),
                  "capacity_bytes": list(r.capacity_bytes), "bubble_fraction": r.bubble, "search_s": r.search_s,
                  "reason": r.reason} for r in result.rows],
    }


def prove_best(best, request, err, args):
    """The chosen plan, the even split over every device and one process, run for real (prove.py)."""
    from dataclasses import replace

    from paraplan.planners.registry import make_plan
    from paraplan.prove import one_process_plan, run_interleaved
    from paraplan.simulate.predict import simulate_plan

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


def print_proof(proof, chosen: str) -> None:
    from rich.table import Table

    from paraplan.report import console

    table = Table(title="proof on this machine: predicted against measured (median of rounds, min..max)")
    for col in ("plan", "predicted", "measured", "error", "chosen is faster by"):
        table.add_column(col, justify="left" if col == "plan" else "right")
    first = proof[0]
    for m in proof:
        speedup = "" if m is first else f"{m.median_s / first.median_s:.2f}x"
        table.add_row(m.name, f"{m.predicted_s * 1e3:.1f} ms",
                      f"{m.median_s * 1e3:.1f} ms ({min(m.rounds_s) * 1e3:.1f}..{max(m.rounds_s) * 1e3:.1f})",
                      f"{m.error:+.1%}", speedup)
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
