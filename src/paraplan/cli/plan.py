"""`paraplan plan`: every method compared (--planner auto, the default: one table, the best feasible
plan written, the lower bound and the winner's gap to it; paraplan/planners/auto.py), or one planner's plan
with the simulator's prediction."""

from __future__ import annotations

import argparse
import json

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
from paraplan.cli.plan_options import add_option_flag
from paraplan.cli.plan_workload import input_note, plan_workload, print_input
from paraplan.cli.ui import BARS, pure_work
from paraplan.errors import ParaplanError
from paraplan.plans.kinds import PlanKind


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
    p.add_argument("--fallbacks", type=int, default=None, metavar="F",
                   help="auto: also plan for the cluster less 1 ... F nodes (less devices on one node), the slowest "
                        "first: a fallback ladder, written to --ladder, the rungs sharing the time limit")
    p.add_argument("--drop", default=None, metavar="NODES",
                   help="--fallbacks: the nodes the rungs drop first, comma-separated (default: the slowest)")
    p.add_argument("--ladder", default=None, help="--fallbacks: the ladder's file (default: beside --out, "
                                                  "NAME.ladder.json)")
    p.add_argument("--mtbf", type=float, default=None, metavar="HOURS",
                   help="auto: a node's mean time between failures in hours: the plans ranked by goodput (samples "
                        "per second trained usefully, checkpoints and restarts counted), said when that changes the "
                        "choice; with --fallbacks, each rung's goodput (default there: Llama 3's, about 5,700 h)")
    p.add_argument("--quiet", action="store_true",
                   help="auto: no progress on stderr while the comparison runs (shown only on a terminal anyway)")
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
                   help="gpipe, 1f1b, interleaved-1f1b, looped-bfs, interleaved-zb, zb-2p, zbv, dualpipev (the split "
                        "planners search its chunks per device), or best: the split planners choose the schedule "
                        "and its chunks with the cut and the micro-batch count, the others plan their own "
                        "(default: the planner's own)")
    p.add_argument("--memory-gib", type=float, default=None, help="memory budget per device (default: the device's)")
    p.add_argument("--memory", type=memory_arg, default=None, dest="memory_size",
                   help="memory budget per device with a unit, e.g. 16GiB, 12GB, 512MiB (the same as --memory-gib), "
                        "or per device type, e.g. a100=36GiB,v100=28GiB (a type as the cluster names it, or a "
                        "prefix naming one; the types not named keep their own memory)")
    p.add_argument("--headroom", type=headroom_arg, default=None,
                   help="the share of each device's memory left unplanned, e.g. 10%% or 0.1 (default: 5%% of the "
                        "device's memory, the memory model's error on published runs; none of a --memory budget)")
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
    add_option_flag(p)
    p.add_argument("--profile", default=None, help="measured profile (paraplan profile) in place of analytic costs")
    from paraplan.cli.machine import add_calibration_flag

    add_calibration_flag(p)
    add_sizes(p)
    add_precision(p)
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="price the plans as this engine runs them (torchtitan, megatron, deepspeed: its dtypes, "
                        "fused kernels and overlaps, docs/engines.md; default: paraplan's own runtime); auto: keep "
                        "only the plans this engine can run, the unrestricted best beside; export it with paraplan "
                        "export")
    p.add_argument("--out", default="plan.json", help="write the plan (with its prediction) here")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.set_defaults(func=run)


def headroom_arg(text: str) -> float:
    """--headroom: a share as 10% or 0.1, in [0, 1)."""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share such as 10% or 0.1, got {text!r}") from None
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"a share of the memory in [0%, 100%), got {text!r}")
    return value


def run(args) -> int:
    args.memory_kinds = None
    if isinstance(args.memory_size, tuple):  # a budget per device type (sizes.memory_by_kind)
        if args.memory_gib is not None:
            raise ParaplanError("give --memory or --memory-gib, not both")
        args.memory_kinds = args.memory_size
    elif args.memory_size is not None:
        if args.memory_gib is not None and args.memory_gib != args.memory_size:
            raise ParaplanError("give --memory or --memory-gib, not both")
        args.memory_gib = args.memory_size
    given = {"eta": args.eta, "seed": args.seed, "method": args.method, "mode": args.mode,
             "runnable": args.runnable}
    if args.planner == "auto":
        from paraplan.cli.plan_auto import run_auto

        return run_auto(args, given)
    return run_one(args, given)


def _options(args, given: dict) -> tuple[object, dict]:
    """The one planner's table entry and its options from the flags, every one checked before any work."""
    from paraplan.cli.plan_options import checked, options_given
    from paraplan.planners.registry import planner

    for flag, value in (("--time-limit", args.time_limit), ("--report", args.report), ("--try-top", args.try_top),
                        ("--fallbacks", args.fallbacks)):
        if value is not None:
            raise ParaplanError(f"{flag}: only with --planner auto (the comparison of every planner)")
    if args.engine is not None:  # one planner: the plan priced as the engine runs it
        from paraplan.costs.engine_profile import engine_profile

        engine_profile(args.engine)
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
    pairs = options_given(args.planner, args.option, given, spec_of_planner.options)  # --option NAME=VALUE
    options.update(pairs)
    checked(args.planner, options, spec_of_planner.options, pairs)  # values too, before any work
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
    w = plan_workload(args, args.cluster, batch=batch, options=options, watch=BARS,
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
    from paraplan.costs.model_flops import plan_achieved
    from paraplan.report.tables import achieved_text
    from paraplan.workload import model_flops_of

    flops = model_flops_of(w.built, w.spec)  # tokens/s, TFLOP/s and MFU per GPU (costs/model_flops.py)
    per_gpu = plan_achieved(flops, sim.plan, request.costs.cluster, sim.prediction.throughput_samples_per_s)
    if args.json:
        _print_one_json(args, sim, feasible, input_note(args, w.built), {**per_gpu.as_json(),
                                                                          "model_flops": flops.as_json()})
    elif feasible and sim.plan.kind is PlanKind.OPERATORS:
        _print_placement(args, sim, request.costs.cluster, achieved_text(per_gpu, flops))
    elif feasible:
        _print_stages(args, sim, request.costs.cluster, achieved_text(per_gpu, flops))
    if not args.json:
        print_input(args, w.built)
    if not feasible:
        planner_reason = plan.prediction.reason if plan.prediction is not None else ""
        if planner_reason and planner_reason != sim.prediction.reason:  # the planner knows more (which layer fits no strategy)
            raise ParaplanError(flags_in(planner_reason))
        raise ParaplanError(f"{args.planner} found no plan that fits: its best {sim.prediction.reason}")
    return 0


def _print_one_json(args, sim, feasible: bool, input_note: str, per_gpu: dict) -> None:
    from paraplan.plans.plan_file import plan_to_dict

    d = plan_to_dict(sim.plan)
    print(json.dumps({"planner": args.planner, "out": args.out if feasible else None, "feasible": feasible,
                      "reason": sim.prediction.reason, "n_stages": sim.plan.n_stages,
                      "n_micro": sim.plan.n_micro, "layers": [s["layers"] for s in d["stages"]],
                      "operators_per_device": {str(p.device): len(p.ops) for p in sim.plan.operators},
                      "prediction": d["prediction"], "search": d["search"],
                      "note": flags_in(sim.plan.search.note), "input_note": input_note, **per_gpu}, indent=2))


def _print_placement(args, sim, cluster, per_gpu: str) -> None:
    """An operator placement: its table, tokens/s, TFLOP/s and MFU per GPU, the schedule's own
    length beside the contended one."""
    from paraplan.report.tables import console, dag_table

    console().print(dag_table(sim, cluster))
    console().print(per_gpu)
    length = dict(sim.plan.search.options).get("schedule_length_s")
    gap = (f"; the schedule's own length {length:.4g} s, simulated with link contention "
           f"{sim.prediction.iteration_s:.4g} s ({sim.prediction.iteration_s / length - 1:+.1%})" if length else "")
    console().print(f"{args.planner}: searched in {sim.plan.search.search_s:.3g} s{gap}; plan written to {args.out}")
    from paraplan.cli.machine import costs_line

    console().print(costs_line(sim.prediction.cost_source))
    if sim.plan.search.note:
        console().print(flags_in(sim.plan.search.note))


def _print_stages(args, sim, cluster, per_gpu: str) -> None:
    """A plan of stages: its table, tokens/s, TFLOP/s and MFU per GPU, its shape in one line, a
    Galvatron plan's runs of one strategy."""
    from paraplan.report.describe import strategy_lines
    from paraplan.report.tables import console, memory_table, simulation_table

    console().print(simulation_table(sim, cluster))
    if sim.memory:
        console().print(memory_table(sim))
    console().print(per_gpu)
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
    for line in strategy_lines(sim.plan, sim.prediction.throughput_samples_per_s):  # per-layer strategies' runs
        console().print(f"  {line}")
    if sim.plan.search.note:  # fewer stages than asked, and why
        console().print(flags_in(sim.plan.search.note))


def _refuse_if_it_cannot_fit(planner_name: str, plan, cm) -> None:
    """A layer plan that does not fit in memory is refused before the simulator: the memory count is
    O(1) a stage, the simulation grows with the micro-batch count (minutes for millions, as a batch
    of 10**12 asks for) and the answer would be the same refusal. Operator placements' memory
    comes from their simulation."""
    from paraplan.costs.memory import out_of_memory_reason, plan_memory

    if plan.kind is PlanKind.OPERATORS:
        return
    planner_reason = plan.prediction.reason if plan.prediction is not None and not plan.prediction.feasible else ""
    capacities = {slot.id: slot.spec.memory_bytes for slot in cm.cluster.devices}
    reason = out_of_memory_reason(plan_memory(plan, cm.model, capacities, cm.memory)[0])
    if reason:
        if planner_reason and planner_reason != reason:  # the planner knows more (which layer fits no strategy)
            raise ParaplanError(flags_in(planner_reason))
        raise ParaplanError(f"{planner_name} found no plan that fits: its best {reason}")


