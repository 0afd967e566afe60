"""`paraplan plan --planner auto` (the default): every planner compared on one request
(paraplan/planners/auto.py), the table, the lower bound and the winner's gap to it, the best
feasible plan written; `--json` (schema `paraplan.plan.auto/1`), `--report`, `--engine`,
`--try-top`, `--prove`."""

from __future__ import annotations

import json
import time

from paraplan.cli.args import check_output, check_plan_sizes, flags_in
from paraplan.cli.plan_workload import input_note, plan_workload, print_input
from paraplan.cli.ui import Bars
from paraplan.errors import ParaplanError


class _Comparing(Bars):
    """The comparison's spinners: one while the model is built and measured (its bar inside), one
    while its operators are traced (for the operator-placement planners)."""

    def __init__(self, err):
        self.err = err

    def measuring(self, reference: str):
        return self.err.status(f"measuring {reference} on meta")

    def tracing(self, built):
        return self.err.status("tracing the operator graph (for the operator-placement planners)")


def check_auto(args, given: dict) -> None:
    if args.batch in ("max", "best"):
        raise ParaplanError(f"--batch {args.batch}: the comparison of every planner is at a given batch; the "
                            "Galvatron planners search it (e.g. --planner galvatron-bmw --batch max)")
    for k, v in given.items():
        if v is not None:
            raise ParaplanError(f"--{k}: an option of one planner; give --planner too")
    if args.option:
        raise ParaplanError(f"--option {args.option[0][0]}: an option of one planner; give --planner too")
    if args.time_limit is not None and not args.time_limit > 0:
        raise ParaplanError(f"--time-limit: must be positive, got {args.time_limit}")
    if args.engine is not None:
        from paraplan.engines import check_engine

        check_engine(args.engine)
    check_plan_sizes(args)
    check_output("--out", args.out)
    if args.fallbacks is not None or args.ladder or args.drop or args.mtbf is not None:
        from paraplan.cli.plan_ladder import check_ladder

        check_ladder(args)
    if args.report:
        check_output("--report", args.report, directory=True)


def _check_runs(args, cluster) -> None:
    """--try-top and --prove run plans for real: here, on this machine, before anything is planned."""
    if args.try_top is not None:
        from paraplan.runtime.launcher.prove import check_this_machine

        if args.try_top < 2:
            raise ParaplanError(f"--try-top: at least 2 plans to try, got {args.try_top}")
        if args.prove:
            raise ParaplanError("--try-top and --prove: one at a time (both run plans for real)")
        check_this_machine(cluster, args.cluster)
    if args.prove or args.try_top is not None:
        from paraplan.runtime.launcher.prove import check_runs_here

        check_runs_here(cluster.n_devices, args.cluster)
        if args.prove_steps <= 2 or args.prove_rounds < 1:
            raise ParaplanError("--prove-steps must be more than 2 (the first two are warm-up) and --prove-rounds "
                                f"positive; got {args.prove_steps} and {args.prove_rounds}")


def run_auto(args, given: dict) -> int:
    """--planner auto: every planner on the same request (planners/auto.py), the best feasible plan written."""
    from paraplan.hardware import load_cluster
    from paraplan.plans.plan_file import write_plan
    from paraplan.report.tables import console
    from paraplan.workload import operator_graph, with_operators

    started = time.perf_counter()
    check_auto(args, given)
    cluster = load_cluster(args.cluster)
    _check_runs(args, cluster)
    err = console(stderr=True)
    # a fallback ladder traces the operator graph first (a comparison per rung reads it); the one
    # comparison traces it once its first planner runs (planners/auto.py: compare's `operators`)
    ladder = args.fallbacks is not None
    w = plan_workload(args, cluster, batch=args.batch, operators="optional" if ladder else None,
                      watch=_Comparing(err))
    request = w.request
    if ladder:  # a fallback ladder (planners/ladder.py): a comparison per rung
        from paraplan.cli.plan_ladder import run_ladder

        return run_ladder(args, w, cluster, started)
    # the time limit counts from the command's start: the model's set-up (seconds for a 70B-like
    # model) comes out of it, leaving the comparison at least half
    limit = args.time_limit or 60.0
    result = _compare(request, err, max(limit - (time.perf_counter() - started), limit / 2), args.quiet,
                      lambda: operator_graph(w.built, optional=True))
    if result.operators is not None:  # the plans of the placement planners are simulated with it below
        w = with_operators(w, result.operators)
        request = w.request
    if args.engine:  # only the plans that engine can run; the unrestricted best kept beside
        from paraplan.cli.export import restricted

        result = restricted(result, args.engine, w)
    best = result.row(result.best) if result.best else None
    by_goodput = ""
    if best is not None and args.mtbf is not None:  # ranked by goodput (issue 53 item 4), said either way
        from paraplan.cli.plan_ladder import goodput_choice

        best, by_goodput = goodput_choice(result, request.costs, args.mtbf)
    if best is not None:
        write_plan(best.plan, args.out)
    gap = best.iteration_s / result.bound.iteration_s - 1 if best is not None else None
    from paraplan.workload import model_flops_of

    flops = model_flops_of(w.built, w.spec)  # for tokens/s, TFLOP/s and MFU per GPU (costs/model_flops.py)
    from paraplan.simulator.experts import expert_summary

    # a mixture of experts: the winner's expert layout and its all-to-alls (simulator/experts.py), and
    # the planners that cannot lay experts out (planners/table.py: expert_parallel), said in one line
    experts = expert_summary(best.plan, w.costs, best.iteration_s) if best is not None else None
    without_ep = _without_expert_parallelism(result, w.costs.model)
    if args.json:
        from paraplan.plans.plan_file import plan_to_dict

        print(json.dumps({**auto_json(result, args.out if best else None, gap, plan_to_dict, flops, w.cluster),
                          "headroom": request.headroom, "input_note": input_note(args, w.built),
                          "best_experts": experts.as_json() if experts is not None else None,
                          "planners_without_expert_parallelism": without_ep, "by_goodput": by_goodput or None},
                         indent=2))
    else:
        _print_comparison(args, result, best, gap, w, flops)
        if by_goodput:
            print(by_goodput)
        if experts is not None:
            print(experts.describe())
        if without_ep:
            print(f"without expert parallelism (their methods have none; their plans hold every expert on every "
                  f"device of a stage): {', '.join(without_ep)}")
        print_input(args, w.built)
    if args.report:  # its memory budget included, as the rows were judged
        _write_report(args, result, request.costs, err, flops)
    if best is not None and args.try_top is not None:
        from paraplan.cli.plan_runs import try_top

        chosen = try_top(result, args, err)
        if chosen is not None:
            write_plan(chosen.plan, args.out)
    if best is not None and args.prove:
        from paraplan.cli.plan_runs import load_average, print_proof, prove_best

        load = load_average()  # before the runs: their own ranks load the cores while they run
        proof = prove_best(best, request, err, args)
        if not args.json:
            print_proof(proof, best.planner, load)
    if best is None:
        from paraplan.planners.auto import no_plan_reason

        raise ParaplanError(no_plan_reason(result, getattr(args, "time_limit", None)))
    return 0


def _compare(request, err, time_limit: float | None, quiet: bool, operators=None):
    """auto.compare with its progress on stderr (cli/comparison_progress.py): the planners done,
    running and skipped, and the best plan so far; on a terminal, unless --quiet (--json too: its
    document is on stdout). `operators`: what traces the operator graph (compare's)."""
    from paraplan.cli.comparison_progress import showing
    from paraplan.planners.auto import compare
    from paraplan.planners.registry import planner_names

    with showing(err, len(planner_names()), quiet) as status:
        return compare(request, time_limit_s=time_limit or 60.0, on_row=status.on_row, on_progress=status.on_progress,
                       operators=operators)


def _write_report(args, result, costs, err, flops=None) -> None:
    """--report: the HTML page, a spinner while it is drawn (seconds at 64 devices), then where it
    is and how long it took (on stderr with --json, whose stdout is the one document)."""
    import sys

    from paraplan.report.html import write_report

    started = time.perf_counter()
    with err.status(f"writing the report into {args.report}"):
        path = write_report(result, costs, args.report, flops)
    print(f"report written to {path} in {time.perf_counter() - started:.1f} s", file=sys.stderr if args.json else None)


def _print_comparison(args, result, best, gap, w, flops) -> None:
    from paraplan.report.tables import (
        achieved_text,
        auto_table,
        compared_text,
        console,
        human_seconds,
        percent,
        row_achieved,
    )

    out = console()
    out.print(auto_table(result, f"{w.built.ref} on {args.cluster} in {w.costs.precision}, global batch {args.batch}",
                         w.cluster, flops))
    b = result.bound
    out.print(f"lower bound {human_seconds(b.iteration_s)}: {b.describe()}; the whole batch on one device takes "
              f"{human_seconds(b.one_device_s)}")
    if best is not None:
        out.print(f"best: {best.planner} ({best.shape}), {human_seconds(best.iteration_s)} per iteration, "
                  f"{best.throughput:.4g} samples/s, {percent(gap, 1, sign=True)} above the lower bound; "
                  f"{compared_text(result)}; plan written to {args.out}")
        per_gpu = row_achieved(best, flops, w.cluster)
        if per_gpu is not None:  # what users compare runs by (costs/model_flops.py)
            out.print(f"  {achieved_text(per_gpu, flops)}")
        from paraplan.cli.machine import costs_line
        from paraplan.simulator.time_split import against_bound

        if best.split is not None:
            parts = against_bound(best.split, result.bound.iteration_s)
            out.print(f"where its {human_seconds(best.iteration_s)} go, per device on average: {parts.describe()}")
        out.print(costs_line(best.plan.prediction.cost_source if best.plan.prediction else ""))
        if best.plan.search and best.plan.search.note:
            out.print(flags_in(best.plan.search.note))
        opts = dict(best.plan.search.options) if best.plan.search else {}
        if "schedules_judged" in opts:  # --schedule best: the winner's schedule and the next best for it
            out.print(f"schedule: {best.plan.schedule}"
                      + (f", {best.plan.virtual_stages} chunks per device" if best.plan.virtual_stages > 1 else "")
                      + f"; next best schedule for this planner: {opts['schedule_runner_up'] or 'none'}")
    if w.request.headroom:
        out.print(f"memory: planned within {1 - w.request.headroom:.0%} of each device's memory (a "
                  f"{w.request.headroom:.0%} headroom for the memory model's own error; --headroom to change it)")
    if result.engine:
        from paraplan.cli.export import engine_line

        out.print(engine_line(result, best))
    elif best is not None:
        from paraplan.cli.export import engines_line
        from paraplan.engines.shape import shape_of

        out.print(engines_line(result, best, shape_of(w.built, w.built.ref)))


def _without_expert_parallelism(result, model) -> list[str] | None:
    """The compared planners that cannot lay a mixture of experts' experts out over devices
    (planners/table.py: PlannerSpec.expert_parallel); None for a dense model."""
    from paraplan.planners.table import PLANNERS

    if not any(layer.experts is not None for layer in model.layers):
        return None
    return [r.planner for r in result.rows if r.planner in PLANNERS and not PLANNERS[r.planner].expert_parallel]


def _parts_json(result) -> dict | None:
    """The winner's iteration against the bound (simulator/time_split.py `GapParts`)."""
    from dataclasses import asdict

    from paraplan.simulator.time_split import against_bound

    split = result.row(result.best).split if result.best else None
    return asdict(against_bound(split, result.bound.iteration_s)) if split is not None else None


def auto_json(result, out: str | None, gap: float | None, plan_to_dict, flops, cluster) -> dict:
    """The stable schema of `paraplan plan --planner auto --json` (version 1; `model_flops` and each
    row's tokens_per_s_per_gpu, tflops_per_gpu, mfu and peak_tflops_per_gpu added by issue 49)."""
    from paraplan.costs.model_flops import achieved_json
    from paraplan.report.tables import row_achieved

    return {
        "schema": "paraplan.plan.auto/1",
        "best": result.best, "out": out, "gap_to_bound": gap, "wall_s": result.wall_s,
        "cost_source": result.row(result.best).plan.prediction.cost_source if result.best else None,
        "engine": result.engine or None,
        "unrestricted_best": result.unrestricted.planner if result.unrestricted else None,
        "lower_bound": {"iteration_s": result.bound.iteration_s, "work_s": result.bound.work_s,
                        "one_device_s": result.bound.one_device_s, "n_devices": result.bound.n_devices,
                        "binding": result.bound.binding, "micro_batch": result.bound.micro_batch,
                        "operator_work_s": result.bound.operator_work_s},
        "best_time_split": _parts_json(result),
        "model_flops": flops.as_json(),
        "rows": [{"planner": r.planner, "status": r.status, "shape": r.shape,
                  "n_micro": r.plan.n_micro if r.plan else None, "iteration_s": r.iteration_s,
                  "throughput_samples_per_s": r.throughput, "peak_bytes": list(r.peak_bytes),
                  **achieved_json(row_achieved(r, flops, cluster)),
                  "capacity_bytes": list(r.capacity_bytes), "bubble_fraction": r.bubble, "search_s": r.search_s,
                  "reason": r.reason, "timed_out": r.timed_out} for r in result.rows],
    }
