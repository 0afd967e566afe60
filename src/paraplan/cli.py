"""The `paraplan` command: parsing, calling the library, printing. No logic of its own.

Bad input ends with one line on stderr and exit status 2 (ParaplanError); anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys

from paraplan import __version__
from paraplan.cli_args import (  # noqa: F401  (tests and callers reach them through paraplan.cli)
    _SEE_NAMES,
    FLAGS,
    _batch_arg,
    _check_output,
    _check_plan_sizes,
    _flags_in,
    _memory_arg,
    _parse_sizes,
    _Parser,
)
from paraplan.cli_signals import Terminated, on_sigterm, pure_work
from paraplan.errors import FieldError, ParaplanError, UnknownNameError, require_positive


def _cmd_models(args) -> int:

    from paraplan.models import zoo
    from paraplan.report import console, models_table

    rows = []
    names = zoo.names(include_tiny=not args.no_tiny)
    with _progress() as progress:
        task = progress.add_task("building on meta", total=len(names))
        for name in names:
            built = zoo.build(name, device="meta")
            params = sum(p.numel() for p in built.module.parameters())
            rows.append((name, built.family, params, len(built.layers()), zoo.entry(name).source))
            progress.advance(task)
    if args.json:
        print(json.dumps([{"model": r[0], "family": r[1], "parameters": r[2], "layers": r[3], "source": r[4]}
                          for r in rows], indent=2))
    else:
        console().print(models_table(rows))
    return 0


def _cmd_clusters(args) -> int:
    from paraplan.hardware import load_cluster, preset_names
    from paraplan.report import clusters_table, console

    clusters = [load_cluster(n) for n in preset_names()]
    if args.json:
        from paraplan.hardware.cluster_file import cluster_to_dict

        print(json.dumps([cluster_to_dict(c) for c in clusters], indent=2))
    else:
        console().print(clusters_table(clusters))
    return 0


def _cmd_inspect(args) -> int:
    from paraplan.costs.analytic import analytic_costs
    from paraplan.hardware import load_cluster
    from paraplan.report import console, layers_table

    require_positive(args.batch, "--batch")
    cluster = load_cluster(args.cluster)
    if not 0 <= args.device < cluster.n_devices:
        raise ParaplanError(f"--device: {cluster.name} has devices 0..{cluster.n_devices - 1}, got {args.device}")
    _, spec = _measured_model(args.model, args.seq_len, args.image_size, args.layers)
    other = 1 if cluster.n_devices > 1 else 0
    link = cluster.link(args.device, (args.device + other) % cluster.n_devices) if other else cluster.nodes[0].intra_link
    device = cluster.device(args.device)
    costs = analytic_costs(spec, device, link)
    if args.json:
        fwd, bwd, send_f, send_b = costs.arrays(args.batch)
        print(json.dumps({
            "model": spec.name, "family": spec.family, "parameters": spec.param_count, "batch": args.batch,
            "cluster": cluster.name, "device": device.name, "inputs": spec.inputs.describe(),
            "layers": [{"index": layer.index, "name": layer.name, "kind": layer.kind, "parameters": layer.param_count,
                        "param_bytes": layer.param_bytes, "shared_param_bytes": layer.shared_param_bytes,
                        "forward_flops_per_sample": layer.forward_flops.per_sample,
                        "backward_flops_per_sample": layer.backward_flops.per_sample,
                        "output_bytes_per_sample": layer.output_bytes.per_sample,
                        "saved_bytes_per_sample": layer.saved_bytes.per_sample,
                        "forward_s": float(fwd[i]), "backward_s": float(bwd[i]),
                        "send_forward_s": float(send_f[i]), "send_backward_s": float(send_b[i])}
                       for i, layer in enumerate(spec.layers)],
        }, indent=2))
    else:
        console().print(layers_table(spec, costs, args.batch, f"{device.name} ({cluster.name})"))
    return 0


def _cmd_simulate(args) -> int:

    from paraplan.costs.memory import GIB, MemoryConfig
    from paraplan.hardware import load_cluster
    from paraplan.plan.plan_file import plan_to_dict, read_plan, write_plan
    from paraplan.report import console, dag_table, simulation_table
    from paraplan.simulate.export import chrome_trace, gantt
    from paraplan.simulate.predict import simulate_plan

    for flag, path, figure in (("--gantt", args.gantt, True), ("--trace", args.trace, False),
                               ("--out", args.out, False)):
        if path:
            _check_output(flag, path, figure=figure)
    plan = read_plan(args.plan)
    cluster = load_cluster(args.cluster or plan.cluster)
    if args.memory_gib is not None:
        require_positive(args.memory_gib, "--memory-gib")
        cluster = cluster.with_memory(int(args.memory_gib * GIB))
    if args.overlap_slowdown < 1:
        raise ParaplanError(f"--overlap-slowdown must be at least 1, got {args.overlap_slowdown}")
    from paraplan.plan.plan import check_fits

    # the plan's devices against the cluster before the model is measured (seconds for a large one);
    # its layer count is checked against the model's once it is measured
    check_fits(plan, plan.n_layers, cluster.n_devices, cluster.name)
    built, spec = _measured_model(plan.model, args.seq_len, args.image_size)
    graph = _operator_graph(built) if plan.schedule == "dag" else None
    cm = _cost_model(args, spec, cluster, memory=MemoryConfig(), overlap_slowdown=args.overlap_slowdown,
                     operators=graph)
    with pure_work():
        sim = simulate_plan(plan, cm, contention=not args.no_contention)
        free = (simulate_plan(plan, cm, contention=False).prediction.iteration_s
                if sim.dag is not None and not args.no_contention else None)
    if free is not None:  # the schedule's own length, beside the contended one
        console(stderr=True).print(f"link contention adds {sim.prediction.iteration_s - free:.4g} s to the "
                                   f"schedule's critical-path length {free:.4g} s (--no-contention: without it)")
    if args.gantt:
        what = (f"{sum(len(p.ops) for p in plan.operators)} operators on {len(plan.operators)} devices"
                if plan.schedule == "dag" else f"{plan.n_stages} stages, {plan.n_micro} micro-batches")
        gantt(sim.timeline, args.gantt, title=f"{plan.model} on {cluster.name}: {plan.schedule}, {what}, "
              f"iteration {sim.prediction.iteration_s:.4g} s")
    if args.trace:
        names = ({int(t): n.name for t, n in zip(sim.dag.tasks, sim.dag.graph.nodes, strict=True)}
                 if sim.dag is not None else None)
        chrome_trace(sim.timeline, args.trace, name=f"{plan.model} {plan.schedule}", task_names=names)
    if args.out:
        write_plan(sim.plan, args.out)
    if args.json:
        out = plan_to_dict(sim.plan)["prediction"]
        out.update(bubble_fraction=sim.bubble_fraction,
                   devices=[{"device": d.device, "busy_s": d.busy_s, "idle_s": d.idle_s} for d in sim.devices])
        print(json.dumps(out, indent=2))
    elif sim.dag is not None:
        console().print(dag_table(sim, cluster))
    else:
        console().print(simulation_table(sim, cluster))
    return 0


def _progress():
    """A transient progress bar on stderr, only where a person watches it (a terminal): piped
    output and error messages stay one clean line."""
    from rich.progress import Progress

    from paraplan.report import console

    err = console(stderr=True)
    return Progress(transient=True, console=err, disable=not err.is_terminal)


def _cost_model(args, spec, cluster, **kwargs):
    from paraplan.costs.model import analytic_cost_model, profile_cost_model

    if getattr(args, "profile", None):
        from paraplan.profiling.operator_file import is_operator_profile, read_operator_profile
        from paraplan.profiling.profile_file import read_profile

        if is_operator_profile(args.profile):  # measured operator times; layers stay analytic
            profile = read_operator_profile(args.profile)
            if profile.model != (spec.ref or spec.name):
                raise ParaplanError(f"{args.profile}: an operator profile of {profile.model}, not {spec.ref or spec.name}")
            return analytic_cost_model(spec, cluster, operator_profile=profile, source="operator-profile", **kwargs)

        return profile_cost_model(spec, cluster, read_profile(args.profile), **kwargs)
    return analytic_cost_model(spec, cluster, **kwargs)


def _operator_graph(built):
    """The operator graph of one training iteration, traced on meta (models/op_trace.py)."""
    from paraplan.models.op_trace import build_op_graph
    from paraplan.report import console

    with console(stderr=True).status(f"tracing the operators of {built.name} on meta"):
        return build_op_graph(built)


def _measured_model(name: str, seq_len, image_size, layers=None):
    """Build any model reference (zoo name, hf:..., file.py:fn; models/ref.py) on meta and measure it."""
    from paraplan.models import measure, source

    built = source.build(name, device="meta", seq_len=seq_len, image_size=image_size, layers=layers)
    with _progress() as progress:
        task = progress.add_task(f"measuring {built.name} on meta", total=2 * measure.count_layers(built))
        return built, measure.measure(built, progress=lambda: progress.advance(task))


def _cmd_plan(args) -> int:
    from paraplan.hardware import load_cluster
    from paraplan.plan.plan_file import plan_to_dict, write_plan
    from paraplan.planners.registry import make_plan, planner
    from paraplan.planners.request import PlanRequest, validated_options
    from paraplan.report import console, dag_table, simulation_table
    from paraplan.simulate.predict import simulate_plan

    if args.memory_size is not None:
        if args.memory_gib is not None and args.memory_gib != args.memory_size:
            raise ParaplanError("give --memory or --memory-gib, not both")
        args.memory_gib = args.memory_size
    given = {"eta": args.eta, "seed": args.seed, "method": args.method, "mode": args.mode,
             "runnable": args.runnable}
    if args.planner == "auto":
        from paraplan.cli_auto import cmd_plan_auto

        return cmd_plan_auto(args, given)
    for flag, value in (("--time-limit", args.time_limit), ("--report", args.report)):
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
    _check_plan_sizes(args)
    _check_output("--out", args.out)
    cluster = load_cluster(args.cluster)
    built, spec = _measured_model(args.model, args.seq_len, args.image_size, args.layers)
    graph = _operator_graph(built) if spec_of_planner.needs_operators else None
    cm = _cost_model(args, spec, cluster, operators=graph)
    # max / best: the planner searches from the smallest step
    batch = 1 if args.batch in ("max", "best") else args.batch
    request = PlanRequest(costs=cm, model_name=built.ref, cluster_name=args.cluster, batch=batch,
                          n_stages=args.stages, n_micro=args.micro_batches, schedule=args.schedule, options=options,
                          memory_bytes=None if args.memory_gib is None else int(args.memory_gib * 2**30),
                          exact_stages=args.exact_stages)
    with console(stderr=True).status(f"planning with {args.planner}"), pure_work():
        plan = make_plan(request, args.planner, predict=False)  # simulated once, below
        if not args.json:  # --json reports the prediction of a plan that does not fit too
            _refuse_if_it_cannot_fit(args.planner, plan, request.costs)
        sim = simulate_plan(plan, request.costs)  # the request's costs: its memory budget included
    feasible = sim.prediction.feasible
    if feasible:
        write_plan(sim.plan, args.out)
    if args.json:
        d = plan_to_dict(sim.plan)
        print(json.dumps({"planner": args.planner, "out": args.out if feasible else None, "feasible": feasible,
                          "reason": sim.prediction.reason, "n_stages": sim.plan.n_stages,
                          "n_micro": sim.plan.n_micro, "layers": [s["layers"] for s in d["stages"]],
                          "operators_per_device": {str(p.device): len(p.ops) for p in sim.plan.operators},
                          "prediction": d["prediction"], "search": d["search"],
                          "note": _flags_in(sim.plan.search.note)}, indent=2))
    elif feasible and sim.dag is not None:
        console().print(dag_table(sim, request.costs.cluster))
        length = dict(sim.plan.search.options).get("schedule_length_s")
        gap = (f"; the schedule's own length {length:.4g} s, simulated with link contention "
               f"{sim.prediction.iteration_s:.4g} s ({sim.prediction.iteration_s / length - 1:+.1%})" if length else "")
        console().print(f"{args.planner}: searched in {sim.plan.search.search_s:.3g} s{gap}; plan written to {args.out}")
        if sim.plan.search.note:
            console().print(_flags_in(sim.plan.search.note))
    elif feasible:
        console().print(simulation_table(sim, request.costs.cluster))
        opts = dict(sim.plan.search.options)
        eq8 = f"; eq. (8) {opts['eq8_time_s']:.6g} s" if "eq8_time_s" in opts else ""
        ranges = [f"{s.layers}" + (f" (backward {s.backward_layers})" if s.backward_layers else "")
                  for s in sim.plan.stages]
        stages = f"{sim.plan.n_stages} stage{'s' if sim.plan.n_stages != 1 else ''}"
        micro = f"{sim.plan.n_micro} micro-batch{'es' if sim.plan.n_micro != 1 else ''}"
        console().print(f"{args.planner}: {stages} {ranges} on devices "
                        f"{[list(s.devices) for s in sim.plan.stages]}, {micro}{eq8}; "
                        f"searched in {sim.plan.search.search_s:.3g} s; plan written to {args.out}")
        if any(stage.strategies for stage in sim.plan.stages):  # Galvatron: runs of one strategy
            from paraplan.planners.galvatron.describe import describe_strategies

            for line in describe_strategies(sim.plan):
                console().print(f"  {line}")
            console().print(f"  global batch {sim.plan.global_batch}, {sim.plan.n_micro} micro-batches, "
                            f"{sim.prediction.throughput_samples_per_s:.4g} samples/s predicted")
        if sim.plan.search.note:  # fewer stages than asked, and why
            console().print(_flags_in(sim.plan.search.note))
    if not feasible:
        planner_reason = plan.prediction.reason if plan.prediction is not None else ""
        if planner_reason and planner_reason != sim.prediction.reason:  # the planner knows more (which layer fits no strategy)
            raise ParaplanError(_flags_in(planner_reason))
        raise ParaplanError(f"{args.planner} found no plan that fits: its best {sim.prediction.reason}")
    return 0


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
            raise ParaplanError(_flags_in(planner_reason))
        raise ParaplanError(f"{planner_name} found no plan that fits: its best {reason}")


def _cmd_train(args) -> int:
    from paraplan.cli_train import cmd_train

    return cmd_train(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="paraplan", description="Plan, predict and run distributed training of PyTorch models.")
    parser.add_argument("--version", action="version", version=f"paraplan {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND",
                                help="what to do (`paraplan COMMAND --help` for its options)")

    p = sub.add_parser("models", help="the model zoo with parameter counts")
    p.add_argument("--no-tiny", action="store_true", help="leave out the tiny CPU variants")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_models)

    p = sub.add_parser("clusters", help="the cluster presets")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_clusters)

    p = sub.add_parser("inspect", help="the layer table of a model: params, FLOPs, activations, times")
    p.add_argument("model", help="a zoo name (paraplan models), hf:TYPE?key=value&... or hf:path/config.json (a transformers config), or path/to/file.py:build_fn returning (model, sample inputs[, sample targets])")
    p.add_argument("--layers", default=None,
                   help="dotted path of the model's list of repeated blocks, where paraplan cannot find it "
                        "(e.g. model.blocks)")
    p.add_argument("--batch", type=int, default=1, help="micro-batch size for the times")
    p.add_argument("--cluster", default="csimd-v100-10gbe", help="preset name or TOML file (`paraplan clusters`)")
    p.add_argument("--device", type=int, default=0, help="which device of the cluster to time on")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_inspect)

    from paraplan.planners.registry import PLANNERS, planner_names

    planner_names()
    p = sub.add_parser("plan", help="find the best plan: every method compared (default), or one planner",
                       epilog="planners:\n" + "\n".join(f"  {n:20s} {s.summary}" for n, s in PLANNERS.items()))
    p.add_argument("--model", required=True, help="a zoo name (paraplan models), hf:TYPE?key=value&... or hf:path/config.json (a transformers config), or path/to/file.py:build_fn returning (model, sample inputs[, sample targets])")
    p.add_argument("--layers", default=None,
                   help="dotted path of the model's list of repeated blocks, where paraplan cannot find it "
                        "(e.g. model.blocks)")
    p.add_argument("--cluster", required=True, help="preset name or TOML file (`paraplan clusters`)")
    p.add_argument("--batch", type=_batch_arg, required=True,
                   help="global batch size (samples per iteration), max: the largest that fits, or best: the "
                        "batch of the highest throughput (Galvatron planners)")
    p.add_argument("--planner", default="auto",
                   help="auto (default): every planner below, each plan judged by the simulator, the best written; "
                        "or one of them")
    p.add_argument("--time-limit", type=float, default=None,
                   help="auto: seconds each planner may take before its row says it timed out (default 60)")
    p.add_argument("--report", default=None, help="auto: write an HTML report (index.html) into this directory")
    p.add_argument("--prove", action="store_true",
                   help="auto: then run the chosen plan, the even split and one process for real on this machine "
                        "(interleaved rounds) and print predicted against measured and the measured speedup")
    p.add_argument("--prove-rounds", type=int, default=3, help="--prove: rounds of the three runs")
    p.add_argument("--prove-steps", type=int, default=12, help="--prove: training steps per run (the first 2 are "
                                                             "warm-up)")
    p.add_argument("--stages", type=int, default=None, help="pipeline stages (default: all devices, at most K)")
    p.add_argument("--micro-batches", type=int, default=None, help="fix the micro-batch count (GPipe-E-p)")
    p.add_argument("--exact-stages", action="store_true",
                   help="use exactly --stages stages (workers), even where fewer would be faster")
    p.add_argument("--schedule", default=None, help="gpipe or 1f1b (default: the planner's own)")
    p.add_argument("--memory-gib", type=float, default=None, help="memory budget per device (default: the device's)")
    p.add_argument("--memory", type=_memory_arg, default=None, dest="memory_size",
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
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--out", default="plan.json", help="write the plan (with its prediction) here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=_cmd_plan)

    p = sub.add_parser("simulate", help="predict a plan's iteration time and memory with the simulator")
    p.add_argument("plan", help="plan JSON file")
    p.add_argument("--cluster", default=None, help="preset or TOML file (default: the plan's cluster)")
    p.add_argument("--gantt", default=None,
                   help="write a Gantt chart here; the extension picks the format (.png, .svg, .pdf, ...)")
    p.add_argument("--trace", default=None, help="write a Chrome trace JSON here (opens in Perfetto)")
    p.add_argument("--out", default=None, help="write the plan with its prediction here")
    p.add_argument("--memory-gib", type=float, default=None, help="memory budget per device (default: the device's)")
    p.add_argument("--no-contention", action="store_true",
                   help="operator placements: transfers never wait for a busy link (the schedule's own model)")
    p.add_argument("--overlap-slowdown", type=float, default=1.0,
                   help="slowdown of compute and communication overlapping on one device (Galvatron: 1.3; "
                        "1: none)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--profile", default=None, help="measured profile (paraplan profile) in place of analytic costs")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("train", help="run a plan for real with torch.distributed (gloo on the CPU)")
    p.add_argument("--plan", required=True, help="plan JSON file (paraplan plan)")
    p.add_argument("--model", default=None, help="default: the plan's model")
    p.add_argument("--steps", type=int, default=3, help="training steps (iterations) to run")
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default: the plan's devices)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (schema paraplan.train/1: losses, step times, memory, comparison)")
    p.add_argument("--seed", type=int, default=0,
                   help="for the initial weights and the batches (synthetic, or which --data samples)")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate")
    p.add_argument("--optimizer", default="adam", help="adam or sgd")
    p.add_argument("--clip-norm", type=float, default=None,
                   help="clip gradients to this norm over the whole model (default: no clipping)")
    p.add_argument("--no-dropout", action="store_true", help="turn dropout off (to compare with one process)")
    p.add_argument("--out-dir", default=None,
                   help="losses.json, timelines and stage<i>.pt go here (default: ./runs/<date>-<time>)")
    p.add_argument("--checkpoint-dir", default=None, help="save each stage's parameters and optimizer state here")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: only at the end)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint-dir (every stage's checkpoint is checked first)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a rank gives up on a dead peer")
    p.add_argument("--compare", action="store_true", help="predicted vs measured iteration time, both timelines")
    p.add_argument("--cluster", default=None,
                   help="for --compare: the cluster to simulate on (default: the plan's cluster)")
    p.add_argument("--profile", default=None, help="for --compare: measured costs (paraplan profile)")
    p.add_argument("--overheads", default=None,
                   help="for --compare: the runtime's overheads measured by an earlier run (its overheads.json; "
                        "default: the --cluster's own if it was calibrated, else the measurement shipped for this "
                        "kind of machine)")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--data", default=None, metavar="PATH",
                   help="train on real data (default: synthetic batches): a token file of flat ids (nanoGPT's "
                        "train.bin) for a language model, or an .npz with arrays 'inputs' and 'labels' "
                        "(docs/runtime.md)")
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), default="uint16",
                   help="the width of each token id in a --data token file")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("profile", help="measure every layer's forward and backward time at several batch sizes")
    p.add_argument("model", nargs="?", default=None, help="a zoo name (paraplan models), hf:TYPE?key=value&... or hf:path/config.json (a transformers config), or path/to/file.py:build_fn returning (model, sample inputs[, sample targets])")
    p.add_argument("--module", default=None, help="the same as the model argument (kept for older scripts)")
    p.add_argument("--layers", default=None,
                   help="dotted path of the model's list of repeated blocks, where paraplan cannot find it "
                        "(e.g. model.blocks)")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32,64", help="micro-batch sizes to time, comma-separated")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run the layers")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 gives stable medians)")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per layer and size (the median is kept)")
    p.add_argument("--warmup", type=int, default=3, help="untimed runs first")
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--no-checks", action="store_true", help="skip the step and repeatability checks")
    p.add_argument("--out", default="profile.json", help="write the profile JSON here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--operators", action="store_true",
                   help="time every operator of one training iteration (FD-DPS planners) instead of the layers; "
                        "--batch-sizes gives the two batches of the affine fit (default 2,4)")
    p.set_defaults(func=_cmd_profile)

    p = sub.add_parser("bench", help="regenerate a paper's evaluation (tables and figures) with an index page")
    p.add_argument("kind", choices=("paper",), help="paper: the papers' reproductions")
    p.add_argument("paper", help="csimd, gropipe, galvatron, fddps, bipartition or all")
    p.add_argument("--out", default="results", help="the directory the reproductions and index.html go into")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("profile-links", help="measure send/recv and all-reduce between real processes")
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="torch.distributed backend")
    p.add_argument("--nproc", type=int, default=2, help="processes to start")
    p.add_argument("--max-bytes", type=int, default=256 * 2**20, help="largest message, in bytes")
    p.add_argument("--cluster", default="local", help="the cluster whose links are replaced")
    p.add_argument("--out", default="cluster.toml", help="write the measured cluster file here")
    p.add_argument("--json", action="store_true", help="print JSON (schema paraplan.profile-links/1) instead of a table")
    p.set_defaults(func=_cmd_profile_links)

    p = sub.add_parser("calibrate", help="measure this machine once (compute, links under load, runtime "
                                         "overheads) and write a cluster file for plan, simulate and train --compare")
    p.add_argument("--out", default="local-calibrated.toml", help="write the calibrated cluster file here (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="one reference model and two overhead runs (~1 minute)")
    p.add_argument("--devices", type=int, default=None,
                   help="devices (CPU cores, one process each) in the written cluster (default: every core)")
    p.add_argument("--json", action="store_true", help="print JSON (schema paraplan.calibrate/1) instead of lines")
    p.set_defaults(func=_cmd_calibrate)
    return parser


def _cmd_profile(args) -> int:
    from paraplan.cli_profile import cmd_profile

    return cmd_profile(args)


def _cmd_bench(args) -> int:
    from paraplan.cli_bench import cmd_bench

    return cmd_bench(args)


def _cmd_calibrate(args) -> int:
    from paraplan.cli_profile import cmd_calibrate

    return cmd_calibrate(args)


def _cmd_profile_links(args) -> int:
    from paraplan.cli_profile import cmd_profile_links

    return cmd_profile_links(args)


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if args.command is None:  # bare `paraplan`: what it can do
            parser.print_help()
            return 0
        from paraplan.host import available_memory_bytes
        from paraplan.simulate.limits import set_memory_source

        set_memory_source(available_memory_bytes)  # the simulator refuses graphs beyond the free memory
        return args.func(args)
    except UnknownNameError as exc:  # close matches only; with none, where to see the names
        where = _SEE_NAMES.get(exc.kind)
        print(f"paraplan: error: {exc}" + (f"; see `{where}`" if where and not exc.close else ""), file=sys.stderr)
        return 2
    except FieldError as exc:
        flag = FLAGS.get(exc.field, exc.field)
        print(f"paraplan: error: {flag}: {exc.detail}", file=sys.stderr)
        return 2
    except ParaplanError as exc:
        print(f"paraplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("paraplan: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("paraplan: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
