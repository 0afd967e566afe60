"""`paraplan simulate`: a plan's predicted iteration time and memory, its Gantt chart and trace."""

from __future__ import annotations

import json
from dataclasses import asdict

from paraplan.cli.args import JSON_HELP, add_sizes, check_output, memory_arg
from paraplan.cli.ui import BARS, pure_work
from paraplan.errors import ParaplanError, require_positive
from paraplan.plans.kinds import PlanKind


def add_parser(sub) -> None:
    p = sub.add_parser("simulate", help="predict a plan's iteration time and memory with the simulator")
    p.add_argument("plan", help="plan JSON file")
    p.add_argument("--cluster", default=None, help="preset or TOML file (default: the plan's cluster)")
    p.add_argument("--gantt", default=None,
                   help="write a Gantt chart here; the extension picks the format (.png, .svg, .pdf, ...)")
    p.add_argument("--trace", default=None, help="write a Chrome trace JSON here (opens in Perfetto)")
    p.add_argument("--out", default=None, help="write the plan with its prediction here")
    p.add_argument("--memory-gib", type=float, default=None, help="memory budget per device (default: the device's)")
    p.add_argument("--memory", type=memory_arg, default=None, dest="memory_size",
                   help="memory budget per device with a unit (16GiB), or per device type (a100=36GiB,v100=28GiB), "
                        "as paraplan plan takes it")
    p.add_argument("--no-contention", action="store_true",
                   help="operator placements: transfers never wait for a busy link (the schedule's own model)")
    p.add_argument("--overlap-slowdown", type=float, default=1.0,
                   help="slowdown of compute and communication overlapping on one device (Galvatron: 1.3; "
                        "1: none)")
    add_sizes(p)
    p.add_argument("--schedules", nargs="?", const="all", default=None, metavar="LIST",
                   help="also the same pipeline under other schedules: a table, and with --gantt the timelines side "
                        "by side. Alone: gpipe, 1f1b, zb-h1, interleaved-1f1b:2, interleaved-1f1b:4, looped-bfs:2, "
                        "interleaved-zb:2, zb-2p, zbv, dualpipev; or a comma-separated list of those (KIND:CHUNKS)")
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--profile", default=None, help="measured profile (paraplan profile) in place of analytic costs")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="price the plan as this engine runs it: paraplan, torchtitan, megatron, deepspeed "
                        "(default: the engine the plan file's prediction was priced for, else paraplan)")
    from paraplan.cli.machine import add_calibration_flag

    add_calibration_flag(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from paraplan.hardware import load_cluster
    from paraplan.plans.plan import check_fits
    from paraplan.plans.plan_file import read_plan, write_plan
    from paraplan.report.tables import console
    from paraplan.simulator.predict import simulate_plan
    from paraplan.sizes import gib_bytes
    from paraplan.workload import precision_of, workload

    for flag, path, figure in (("--gantt", args.gantt, True), ("--trace", args.trace, False),
                               ("--out", args.out, False)):
        if path:
            check_output(flag, path, figure=figure)
    plan = read_plan(args.plan)
    from paraplan.cli.machine import machine_cluster

    # `local` is this machine's cached calibration (cli/machine.py)
    cluster = load_cluster(machine_cluster(args.cluster or plan.cluster, plan.precision,
                                           skip=args.no_calibration or bool(args.profile)))
    if args.memory_gib is not None and args.memory_size is not None:
        raise ParaplanError("give --memory or --memory-gib, not both")
    if args.memory_gib is not None:
        require_positive(args.memory_gib, "--memory-gib")
        cluster = cluster.with_memory(gib_bytes(args.memory_gib))
    elif isinstance(args.memory_size, tuple):  # a budget per device type (planners/request.py resolves it)
        from paraplan.planners.request import resolve_kinds

        cluster = cluster.with_memory_of_kinds(dict(resolve_kinds(cluster, args.memory_size)))
    elif args.memory_size is not None:
        cluster = cluster.with_memory(gib_bytes(args.memory_size))
    if args.overlap_slowdown < 1:
        raise ParaplanError(f"--overlap-slowdown must be at least 1, got {args.overlap_slowdown}")
    # the plan's devices against the cluster before the model is measured (seconds for a large one);
    # its layer count is checked against the model's once it is measured
    check_fits(plan, plan.n_layers, cluster.n_devices, cluster.name)
    engine = args.engine or (plan.prediction.engine if plan.prediction is not None else "paraplan")
    w = workload(plan.model, cluster, profile=args.profile, overlap_slowdown=args.overlap_slowdown,
                 seq_len=args.seq_len, image_size=args.image_size, engine=engine, **precision_of(plan),
                 operators="required" if plan.kind is PlanKind.OPERATORS else None, watch=BARS)
    with pure_work():
        sim = simulate_plan(plan, w.costs, contention=not args.no_contention)
        free = (simulate_plan(plan, w.costs, contention=False).prediction.iteration_s
                if sim.dag is not None and not args.no_contention else None)
    if free is not None:  # the schedule's own length, beside the contended one
        console(stderr=True).print(f"link contention adds {sim.prediction.iteration_s - free:.4g} s to the "
                                   f"schedule's critical-path length {free:.4g} s (--no-contention: without it)")
    compared = _compare_schedules(plan, w.costs, args.schedules) if args.schedules else None
    if compared is not None and args.gantt:
        _side_by_side(args.gantt, plan, cluster, compared)
    else:
        _write_figures(args, plan, sim, cluster)
    if args.out:
        write_plan(sim.plan, args.out)
    from paraplan.workload import size_note

    # the size the prediction is for, and where it came from (issue 46): a line, or --json's input_note
    note = size_note(w.built, seq_len=args.seq_len, image_size=args.image_size)
    from paraplan.simulator.experts import expert_summary
    from paraplan.workload import model_flops_of

    experts = expert_summary(sim.plan, w.costs, sim.prediction.iteration_s)
    _print(args, sim, cluster, compared, note, model_flops_of(w.built, w.spec), experts)
    if not args.json:
        console().print(f"input: {note}")
    return 0


def _compare_schedules(plan, cm, which: str) -> list:
    """(variant, its simulation or None) for each schedule asked (`--schedules`)."""
    from paraplan.errors import ParaplanError
    from paraplan.planners.schedule_variants import DEFAULT_VARIANTS, parse_variants, variants
    from paraplan.simulator.predict import simulate_plan

    if plan.kind is PlanKind.OPERATORS:
        raise ParaplanError("--schedules: an operator placement has no pipeline schedule to vary")
    try:
        kinds = DEFAULT_VARIANTS if which == "all" else parse_variants(which)
    except ValueError as exc:
        raise ParaplanError(f"--schedules: {exc}") from None
    out = []
    with pure_work():
        for v in variants(plan, cm, kinds):
            out.append((v, simulate_plan(v.plan, cm) if v.plan is not None else None))
    return out


def _side_by_side(path, plan, cluster, compared) -> None:
    from paraplan.report.tables import human_bytes, human_seconds, percent, short_model
    from paraplan.simulator.export import gantt_side_by_side

    model = short_model(plan.model)
    gantt_side_by_side([(sim.timeline, f"{model} on {cluster.name}, {v.label}: "
                                       f"{human_seconds(sim.prediction.iteration_s)}, bubble {percent(sim.bubble_fraction)}, "
                                       f"peak memory {human_bytes(max(m.peak_bytes for m in sim.prediction.memory))}"
                                       + ("" if sim.prediction.feasible else " (out of memory)"))
                        for v, sim in compared if sim is not None], path)


def _write_figures(args, plan, sim, cluster) -> None:
    """--gantt and --trace."""
    from paraplan.simulator.export import chrome_trace, gantt

    if args.gantt:
        what = (f"{sum(len(p.ops) for p in plan.operators)} operators on {len(plan.operators)} devices"
                if plan.kind is PlanKind.OPERATORS else f"{plan.n_stages} stages, {plan.n_micro} micro-batches")
        gantt(sim.timeline, args.gantt, title=f"{plan.model} on {cluster.name}: {plan.schedule}, {what}, "
              f"iteration {sim.prediction.iteration_s:.4g} s", plan=sim.plan, iteration_s=sim.prediction.iteration_s)
    if args.trace:
        names = ({int(t): n.name for t, n in zip(sim.dag.tasks, sim.dag.graph.nodes, strict=True)}
                 if sim.dag is not None else None)
        chrome_trace(sim.timeline, args.trace, name=f"{plan.model} {plan.schedule}", task_names=names)


def _print(args, sim, cluster, compared, input_note: str, flops, experts=None) -> None:
    """The prediction, with tokens/s, TFLOP/s and MFU per GPU (costs/model_flops.py: `flops` at its
    throughput over the plan's devices' peaks); a mixture of experts' layout and all-to-all share
    (simulator/experts.py: `experts`)."""
    from paraplan.costs.model_flops import plan_achieved
    from paraplan.plans.plan_file import plan_to_dict
    from paraplan.report.tables import (
        achieved_text,
        console,
        dag_table,
        human_seconds,
        memory_at_peak,
        memory_table,
        schedules_table,
        simulation_table,
    )

    per_gpu = plan_achieved(flops, sim.plan, cluster, sim.prediction.throughput_samples_per_s)
    if args.json:
        out = plan_to_dict(sim.plan)["prediction"]
        out.update(bubble_fraction=sim.bubble_fraction, precision=str(sim.plan.precision),
                   devices=[{"device": d.device, "busy_s": d.busy_s, "idle_s": d.idle_s} for d in sim.devices],
                   # where the iteration goes, per device over the cluster (simulator/time_split.py)
                   time_split={**asdict(sim.split), "idle_s": sim.split.idle_s},
                   # what each stage's devices hold at their peak, by category, heaviest first (layer plans)
                   memory_at_peak=memory_at_peak(sim), input_note=input_note,
                   # what users compare runs by, and how the model's FLOPs were counted
                   **per_gpu.as_json(), model_flops=flops.as_json())
        if experts is not None:
            out["experts"] = experts.as_json()
        if compared is not None:
            out["schedules"] = [{"schedule": v.kind, "virtual_stages": v.virtual_stages, "reason": v.reason}
                                if s is None else
                                {"schedule": v.kind, "virtual_stages": v.virtual_stages,
                                 "iteration_s": s.prediction.iteration_s, "bubble_fraction": s.bubble_fraction,
                                 "peak_bytes": max(m.peak_bytes for m in s.prediction.memory),
                                 "feasible": s.prediction.feasible, "reason": s.prediction.reason}
                                for v, s in compared]
        print(json.dumps(out, indent=2))
        return
    if compared is not None:
        console().print(schedules_table(sim, compared))
    if sim.dag is not None:
        console().print(dag_table(sim, cluster))
    else:
        console().print(simulation_table(sim, cluster))
        if sim.memory:
            console().print(memory_table(sim))
    console().print(achieved_text(per_gpu, flops))
    if experts is not None:
        console().print(experts.describe())
    console().print(f"where the {human_seconds(sim.prediction.iteration_s)} go, per device on average: "
                    f"{sim.split.describe()}")
    from paraplan.cli.machine import costs_line

    console().print(costs_line(sim.prediction.cost_source))
