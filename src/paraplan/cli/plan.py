"""`paraplan plan`: every method compared (--planner auto, the default: one table, the best feasible
plan written, the lower bound and the winner's gap to it; paraplan/planners/auto.py), or one planner's plan
with the simulator's prediction."""

from __future__ import annotations

import argparse
import json
import time

from paraplan.cli.args import (
    JSON_HELP,
    LAYERS_HELP,
    MODEL_HELP,
    add_precision,
    add_sizes,
    batch_arg,
    check_output,
    check_plan_sizes,
    flags_in,
    memory_arg,
)
from paraplan.cli.ui import BARS, Bars, pure_work
from paraplan.errors import ParaplanError


def add_parser(sub) -> None:
    from paraplan.planners.registry import PLANNERS, planner_names

    planner_names()
    p = sub.add_parser("plan", help="find the best plan: every method compared (default), or one planner",
                       epilog="planners:\n" + "\n".join(f"  {n:20s} {s.summary}" for n, s in PLANNERS.items()))
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--layers", default=None, help=LAYERS_HELP)
    p.add_argument("--cluster", required=True, help="preset name or TOML file (`paraplan clusters`)")
    p.add_argument("--batch", type=batch_arg, required=True,
                   help="global batch size (samples per iteration), max: the largest that fits, or best: the "
                        "batch of the highest throughput (Galvatron planners)")
    p.add_argument("--planner", default="auto",
                   help="auto (default): every planner below, each plan judged by the simulator, the best written; "
                        "or one of them")
    p.add_argument("--time-limit", type=float, default=None,
                   help="auto: seconds the comparison may take, the model's set-up included; a search still "
                        "running then answers with its best plan so far, said to be so (default 60)")
    p.add_argument("--report", default=None, help="auto: write an HTML report (index.html) into this directory")
    p.add_argument("--prove", action="store_true",
                   help="auto: then run the chosen plan, the even split and one process for real on this machine "
                        "(interleaved rounds) and print predicted against measured and the measured speedup")
    p.add_argument("--try-top", type=int, default=None, metavar="K",
                   help="auto: then run the K best predicted plans for real on this machine (interleaved rounds, "
                        "--prove-rounds x --prove-steps) and write the measured best")
    p.add_argument("--prove-rounds", type=int, default=3, help="--prove / --try-top: rounds of the runs")
    p.add_argument("--prove-steps", type=int, default=12, help="--prove: training steps per run (the first 2 are "
                                                             "warm-up)")
    p.add_argument("--stages", type=int, default=None, help="pipeline stages (default: all devices, at most K)")
    p.add_argument("--micro-batches", type=int, default=None, help="fix the micro-batch count (GPipe-E-p)")
    p.add_argument("--exact-stages", action="store_true",
                   help="use exactly --stages stages (workers), even where fewer would be faster")
    p.add_argument("--schedule", default=None,
                   help="gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zbv, dualpipev (the split "
                        "planners search its chunks per device), or best: the split planners choose the schedule "
                        "and its chunks with the cut and the micro-batch count, the others plan their own "
                        "(default: the planner's own)")
    p.add_argument("--memory-gib", type=float, default=None, help="memory budget per device (default: the device's)")
    p.add_argument("--memory", type=memory_arg, default=None, dest="memory_size",
                   help="memory budget per device with a unit, e.g. 16GiB, 12GB, 512MiB (the same as --memory-gib)")
    p.add_argument("--eta", type=int, default=None, help="IMD weight groups (CSIMD's eta; default 1000)")
    p.add_argument("--method", default=None, help="csimd's division search: auto, imd, exact, exact-time")
    p.add_argument("--runnable", default=None, action=argparse.BooleanOptionalAction,
                   help="operator placements (fddps, fastt, heft, mpdps): keep every backward operator on its "
                        "forward's device, as paraplan train needs (default); --no-runnable: the paper's free "
                        "placement, for simulation studies")
    p.add_argument("--mode", default=None, help="bipartition's cost of a layer split between two workers: runtime "
                                                "(default: as paraplan train runs it, recomputed by its backward "
                                                "owner) or paper (saved activations sent; cannot run in PyTorch)")
    p.add_argument("--seed", type=int, default=None, help="for the random baseline (default 0)")
    p.add_argument("--profile", default=None, help="measured profile (paraplan profile) in place of analytic costs")
    from paraplan.cli.machine import add_calibration_flag

    add_calibration_flag(p)
    add_sizes(p)
    add_precision(p)
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="auto: keep only the plans this engine can run (torchtitan, megatron, deepspeed; "
                        "docs/engines.md), the unrestricted best beside; export it with paraplan export")
    p.add_argument("--out", default="plan.json", help="write the plan (with its prediction) here")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run)


def run(args) -> int:
    if args.memory_size is not None:
        if args.memory_gib is not None and args.memory_gib != args.memory_size:
            raise ParaplanError("give --memory or --memory-gib, not both")
        args.memory_gib = args.memory_size
    given = {"eta": args.eta, "seed": args.seed, "method": args.method, "mode": args.mode,
             "runnable": args.runnable}
    if args.planner == "auto":
        return run_auto(args, given)
    return run_one(args, given)


def _workload(args, cluster, *, batch, operators: str | None, watch, options=None):
    """The request of the flags: the model measured on the cluster, its costs, its limits. `local`
    is this machine's cached calibration (cli/machine.py) unless --no-calibration or --profile."""
    from paraplan.cli.machine import machine_cluster
    from paraplan.hardware import load_cluster
    from paraplan.sizes import gib_bytes
    from paraplan.workload import workload

    if isinstance(cluster, str) or getattr(cluster, "name", None) == "local":
        def check_model() -> None:  # the model refused (an MoE, a failing build) before this machine is measured
            from paraplan.workload import built_model

            built_model(args.model, seq_len=args.seq_len, image_size=args.image_size, layers=args.layers)

        measured = machine_cluster(args.cluster, args.precision, skip=args.no_calibration or bool(args.profile),
                                   check=check_model)
        if measured != args.cluster:
            cluster = load_cluster(measured)

    return workload(args.model, cluster, cluster_name=args.cluster, batch=batch, profile=args.profile,
                    memory=None if args.memory_gib is None else gib_bytes(args.memory_gib), seq_len=args.seq_len,
                    image_size=args.image_size, layers=args.layers, operators=operators, stages=args.stages,
                    micro_batches=args.micro_batches, schedule=args.schedule, exact_stages=args.exact_stages,
                    options=options, watch=watch, precision=args.precision)


def _options(args, given: dict) -> tuple[object, dict]:
    """The one planner's table entry and its options from the flags, every one checked before any work."""
    from paraplan.planners.registry import planner
    from paraplan.planners.request import validated_options

    for flag, value in (("--time-limit", args.time_limit), ("--report", args.report), ("--try-top", args.try_top),
                        ("--engine", args.engine)):
        if value is not None:
            raise ParaplanError(f"{flag}: only with --planner auto (the comparison of every planner)")
    spec_of_planner = planner(args.planner)  # an unknown name fails before any work
    if args.batch in ("max", "best"):
        if "batch_search" not in spec_of_planner.options:
            raise ParaplanError(f"--batch {args.batch}: planner {args.planner!r} plans a given batch; the Galvatron "
                                "planners search it (e.g. --planner galvatron-bmw)")
        given["batch_search"] = args.batch
    for k, v in given.items():
        if v is not None and k not in spec_of_planner.options:
            raise ParaplanError(f"--{k}: planner {args.planner!r} has no such option")
    options = {k: v for k, v in given.items() if v is not None and k in spec_of_planner.options}
    validated_options(args.planner, options, spec_of_planner.options)  # values too, before any work
    return spec_of_planner, options


def run_one(args, given: dict) -> int:
    """--planner NAME: that planner's plan, simulated, written when it fits."""
    from paraplan.planners.registry import make_plan
    from paraplan.plans.plan_file import write_plan
    from paraplan.report.tables import console
    from paraplan.simulator.predict import simulate_plan

    spec_of_planner, options = _options(args, given)
    check_plan_sizes(args)
    check_output("--out", args.out)
    # max / best: the planner searches from the smallest step
    batch = 1 if args.batch in ("max", "best") else args.batch
    w = _workload(args, args.cluster, batch=batch, options=options, watch=BARS,
                  operators="required" if spec_of_planner.needs_operators else None)
    request = w.request
    with console(stderr=True).status(f"planning with {args.planner}"), pure_work():
        plan = make_plan(request, args.planner, predict=False)  # simulated once, below
        if not args.json:  # --json reports the prediction of a plan that does not fit too
            _refuse_if_it_cannot_fit(args.planner, plan, request.costs)
        sim = simulate_plan(plan, request.costs)  # the request's costs: its memory budget included
    feasible = sim.prediction.feasible
    if feasible:
        write_plan(sim.plan, args.out)
    if args.json:
        _print_one_json(args, sim, feasible, _input_note(args, w.built))
    elif feasible and sim.dag is not None:
        _print_placement(args, sim, request.costs.cluster)
    elif feasible:
        _print_stages(args, sim, request.costs.cluster)
    if not args.json:
        _print_input(args, w.built)
    if not feasible:
        planner_reason = plan.prediction.reason if plan.prediction is not None else ""
        if planner_reason and planner_reason != sim.prediction.reason:  # the planner knows more (which layer fits no strategy)
            raise ParaplanError(flags_in(planner_reason))
        raise ParaplanError(f"{args.planner} found no plan that fits: its best {sim.prediction.reason}")
    return 0


def _print_input(args, built) -> None:
    """The input size the plan is for and where it came from (`paraplan plan --model llama2-7b` plans
    at CSIMD's 32 tokens unless told otherwise: issue 46), on the console the table went to."""
    from paraplan.report.tables import console

    console(stderr=args.json).print(f"input: {_input_note(args, built)}")


def _input_note(args, built) -> str:
    """"seq 32 (the zoo's setting for llama2-7b: ...; --seq-len N to change)": the line above, and
    --json's `input_note`."""
    from paraplan.workload import size_note

    return size_note(built, seq_len=args.seq_len, image_size=args.image_size)


def _print_one_json(args, sim, feasible: bool, input_note: str) -> None:
    from paraplan.plans.plan_file import plan_to_dict

    d = plan_to_dict(sim.plan)
    print(json.dumps({"planner": args.planner, "out": args.out if feasible else None, "feasible": feasible,
                      "reason": sim.prediction.reason, "n_stages": sim.plan.n_stages,
                      "n_micro": sim.plan.n_micro, "layers": [s["layers"] for s in d["stages"]],
                      "operators_per_device": {str(p.device): len(p.ops) for p in sim.plan.operators},
                      "prediction": d["prediction"], "search": d["search"],
                      "note": flags_in(sim.plan.search.note), "input_note": input_note}, indent=2))


def _print_placement(args, sim, cluster) -> None:
    """An operator placement: its table, the schedule's own length beside the contended one."""
    from paraplan.report.tables import console, dag_table

    console().print(dag_table(sim, cluster))
    length = dict(sim.plan.search.options).get("schedule_length_s")
    gap = (f"; the schedule's own length {length:.4g} s, simulated with link contention "
           f"{sim.prediction.iteration_s:.4g} s ({sim.prediction.iteration_s / length - 1:+.1%})" if length else "")
    console().print(f"{args.planner}: searched in {sim.plan.search.search_s:.3g} s{gap}; plan written to {args.out}")
    from paraplan.cli.machine import costs_line

    console().print(costs_line(sim.prediction.cost_source))
    if sim.plan.search.note:
        console().print(flags_in(sim.plan.search.note))


def _print_stages(args, sim, cluster) -> None:
    """A plan of stages: its table, its shape in one line, a Galvatron plan's runs of one strategy."""
    from paraplan.report.tables import console, memory_table, simulation_table

    console().print(simulation_table(sim, cluster))
    if sim.memory:
        console().print(memory_table(sim))
    opts = dict(sim.plan.search.options)
    eq8 = f"; eq. (8) {opts['eq8_time_s']:.6g} s" if "eq8_time_s" in opts else ""
    ranges = [f"{s.layers}" + (f" (backward {s.backward_layers})" if s.backward_layers else "")
              for s in sim.plan.stages]
    stages = f"{sim.plan.n_stages} stage{'s' if sim.plan.n_stages != 1 else ''}"
    micro = f"{sim.plan.n_micro} micro-batch{'es' if sim.plan.n_micro != 1 else ''}"
    found = f"; the plan of {opts['found_by']}, in its final choice" if "found_by" in opts else ""
    console().print(f"{args.planner}: {stages} {ranges} on devices "
                    f"{[list(s.devices) for s in sim.plan.stages]}, {micro}{eq8}; "
                    f"searched in {sim.plan.search.search_s:.3g} s{found}; plan written to {args.out}")
    from paraplan.cli.machine import costs_line

    console().print(costs_line(sim.prediction.cost_source))
    if "schedules_judged" in opts:  # --schedule best: the schedule that won and the next best
        chunks = f", {sim.plan.virtual_stages} chunks per device" if sim.plan.virtual_stages > 1 else ""
        console().print(f"schedule: {sim.plan.schedule}{chunks}, the fastest that fits of {opts['schedules_judged']} "
                        f"(schedule, chunks, micro-batches) judged; next best: {opts['schedule_runner_up'] or 'none'}")
    if any(stage.strategies for stage in sim.plan.stages):  # Galvatron: runs of one strategy
        from paraplan.planners.galvatron.describe import describe_strategies

        for line in describe_strategies(sim.plan):
            console().print(f"  {line}")
        console().print(f"  global batch {sim.plan.global_batch}, {sim.plan.n_micro} micro-batches, "
                        f"{sim.prediction.throughput_samples_per_s:.4g} samples/s predicted")
    if sim.plan.search.note:  # fewer stages than asked, and why
        console().print(flags_in(sim.plan.search.note))


def _refuse_if_it_cannot_fit(planner_name: str, plan, cm) -> None:
    """A layer plan that does not fit in memory is refused before the simulator: the memory count is
    O(1) a stage, the simulation grows with the micro-batch count (minutes for millions, as a batch
    of 10**12 asks for) and the answer would be the same refusal. Operator placements' memory
    comes from their simulation."""
    from paraplan.costs.memory import out_of_memory_reason, plan_memory

    if plan.schedule == "dag":
        return
    planner_reason = plan.prediction.reason if plan.prediction is not None and not plan.prediction.feasible else ""
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    reason = out_of_memory_reason(plan_memory(plan, cm.model, capacities, cm.memory)[0])
    if reason:
        if planner_reason and planner_reason != reason:  # the planner knows more (which layer fits no strategy)
            raise ParaplanError(flags_in(planner_reason))
        raise ParaplanError(f"{planner_name} found no plan that fits: its best {reason}")


class _Comparing(Bars):
    """The comparison's spinners: one while the model is built and measured (its bar inside), one
    while its operators are traced (for the operator-placement planners)."""

    def __init__(self, err):
        self.err = err

    def measuring(self, reference: str):
        return self.err.status(f"measuring {reference} on meta")

    def tracing(self, built):
        return self.err.status("tracing the operator graph (for the operator-placement planners)")


def _check_auto(args, given: dict) -> None:
    if args.batch in ("max", "best"):
        raise ParaplanError(f"--batch {args.batch}: the comparison of every planner is at a given batch; the "
                            "Galvatron planners search it (e.g. --planner galvatron-bmw --batch max)")
    for k, v in given.items():
        if v is not None:
            raise ParaplanError(f"--{k}: an option of one planner; give --planner too")
    if args.time_limit is not None and not args.time_limit > 0:
        raise ParaplanError(f"--time-limit: must be positive, got {args.time_limit}")
    if args.engine is not None:
        from paraplan.engines import check_engine

        check_engine(args.engine)
    check_plan_sizes(args)
    check_output("--out", args.out)
    if args.report:
        check_output("--report", args.report, directory=True)


def run_auto(args, given: dict) -> int:
    """--planner auto: every planner on the same request (planners/auto.py), the best feasible plan written."""
    from paraplan.hardware import load_cluster
    from paraplan.plans.plan_file import write_plan
    from paraplan.report.tables import console

    started = time.perf_counter()
    _check_auto(args, given)
    cluster = load_cluster(args.cluster)
    if args.try_top is not None:
        from paraplan.runtime.prove import check_this_machine

        if args.try_top < 2:
            raise ParaplanError(f"--try-top: at least 2 plans to try, got {args.try_top}")
        if args.prove:
            raise ParaplanError("--try-top and --prove: one at a time (both run plans for real)")
        check_this_machine(cluster, args.cluster)
    if args.prove or args.try_top is not None:
        from paraplan.runtime.prove import check_runs_here

        check_runs_here(cluster.n_devices, args.cluster)
        if args.prove_steps <= 2 or args.prove_rounds < 1:
            raise ParaplanError("--prove-steps must be more than 2 (the first two are warm-up) and --prove-rounds "
                                f"positive; got {args.prove_steps} and {args.prove_rounds}")
    err = console(stderr=True)
    w = _workload(args, cluster, batch=args.batch, operators="optional", watch=_Comparing(err))
    request = w.request
    # the time limit counts from the command's start: the model's set-up (seconds for a 70B-like
    # model) comes out of it, leaving the comparison at least half
    limit = args.time_limit or 60.0
    result = _compare(request, err, max(limit - (time.perf_counter() - started), limit / 2), args.json)
    if args.engine:  # only the plans that engine can run; the unrestricted best kept beside
        from paraplan.cli.export import restricted

        result = restricted(result, args.engine, w)
    best = result.row(result.best) if result.best else None
    if best is not None:
        write_plan(best.plan, args.out)
    gap = best.iteration_s / result.bound.iteration_s - 1 if best is not None else None
    if args.json:
        from paraplan.plans.plan_file import plan_to_dict

        print(json.dumps({**auto_json(result, args.out if best else None, gap, plan_to_dict),
                          "input_note": _input_note(args, w.built)}, indent=2))
    else:
        _print_comparison(args, result, best, gap, w.built.ref, w.costs)
        _print_input(args, w.built)
    if args.report:  # its memory budget included, as the rows were judged
        _write_report(args, result, request.costs, err)
    if best is not None and args.try_top is not None:
        from paraplan.cli.plan_runs import try_top

        chosen = try_top(result, args, err)
        if chosen is not None:
            write_plan(chosen.plan, args.out)
    if best is not None and args.prove:
        from paraplan.cli.plan_runs import print_proof, prove_best

        proof = prove_best(best, request, err, args)
        if not args.json:
            print_proof(proof, best.planner)
    if best is None:
        from paraplan.planners.auto import no_plan_reason

        raise ParaplanError(no_plan_reason(result, getattr(args, "time_limit", None)))
    return 0


def _compare(request, err, time_limit: float | None, quiet: bool):
    """auto.compare with a bar of the planners done on stderr (none with --json)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from paraplan.planners.auto import compare
    from paraplan.planners.registry import planner_names

    total = len(planner_names())
    with Progress(TextColumn("comparing planners"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=err, transient=True,
                  disable=quiet) as progress:
        task = progress.add_task("", total=total)

        def on_row(row) -> None:
            progress.update(task, advance=1, description=f"{row.planner}: {row.status}")

        return compare(request, time_limit_s=time_limit or 60.0, on_row=on_row)


def _write_report(args, result, costs, err) -> None:
    """--report: the HTML page, a spinner while it is drawn (seconds at 64 devices), then where it
    is and how long it took (on stderr with --json, whose stdout is the one document)."""
    import sys

    from paraplan.report.html import write_report

    started = time.perf_counter()
    with err.status(f"writing the report into {args.report}"):
        path = write_report(result, costs, args.report)
    print(f"report written to {path} in {time.perf_counter() - started:.1f} s", file=sys.stderr if args.json else None)


def _print_comparison(args, result, best, gap, model_ref: str, costs) -> None:
    from paraplan.report.tables import auto_table, compared_text, console, human_seconds, percent

    out = console()
    out.print(auto_table(result, f"{model_ref} on {args.cluster} in {costs.precision}, global batch {args.batch}",
                         costs.cluster))
    b = result.bound
    out.print(f"lower bound {human_seconds(b.iteration_s)}: {b.describe()}; the whole batch on one device takes "
              f"{human_seconds(b.one_device_s)}")
    if best is not None:
        out.print(f"best: {best.planner} ({best.shape}), {human_seconds(best.iteration_s)} per iteration, "
                  f"{best.throughput:.4g} samples/s, {percent(gap, 1, sign=True)} above the lower bound; "
                  f"{compared_text(result)}; plan written to {args.out}")
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
    if result.engine:
        from paraplan.cli.export import engine_line

        out.print(engine_line(result, best))


def _parts_json(result) -> dict | None:
    """The winner's iteration against the bound (simulator/time_split.py `GapParts`)."""
    from dataclasses import asdict

    from paraplan.simulator.time_split import against_bound

    split = result.row(result.best).split if result.best else None
    return asdict(against_bound(split, result.bound.iteration_s)) if split is not None else None


def auto_json(result, out: str | None, gap: float | None, plan_to_dict) -> dict:
    """The stable schema of `paraplan plan --planner auto --json` (version 1)."""
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
        "rows": [{"planner": r.planner, "status": r.status, "shape": r.shape,
                  "n_micro": r.plan.n_micro if r.plan else None, "iteration_s": r.iteration_s,
                  "throughput_samples_per_s": r.throughput, "peak_bytes": list(r.peak_bytes),
                  "capacity_bytes": list(r.capacity_bytes), "bubble_fraction": r.bubble, "search_s": r.search_s,
                  "reason": r.reason, "timed_out": r.timed_out} for r in result.rows],
    }
