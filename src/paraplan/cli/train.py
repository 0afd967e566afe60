"""`paraplan train`: run a plan for real (runtime/), then print the measured steps, memory and the
comparison with the prediction. Every check runs before the ranks start."""

from __future__ import annotations

import sys

from paraplan.cli.args import add_sizes
from paraplan.cli.train_files import check_outputs, clear_rank_files
from paraplan.cli.train_interval import auto_interval, every_arg
from paraplan.cli.ui import BARS
from paraplan.errors import FieldError, ParaplanError
from paraplan.plans.kinds import PlanKind


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="run a plan for real with torch.distributed (gloo on the CPU)")
    p.add_argument("--plan", required=True, help="plan JSON file (paraplan plan), or a fallback ladder (paraplan plan "
                                                 "--fallbacks F) with --rung")
    p.add_argument("--rung", type=int, default=None,
                   help="with a ladder as --plan: the rung to train (0: the whole cluster; K: the plan without K "
                        "nodes)")
    p.add_argument("--model", default=None, help="default: the plan's model")
    p.add_argument("--steps", type=int, default=3, help="training steps (iterations) to run")
    p.add_argument("--nproc", type=int, default=None, help="ranks to start (default: the plan's devices)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (schema paraplan.train/2: losses, step times, memory, comparison)")
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
    p.add_argument("--checkpoint-every", type=every_arg, default=0,
                   help="steps between checkpoints (0: only at the end; auto: Young's interval sqrt(2 C M_job) from "
                        "the plan's predicted iteration and checkpoint write time and a node failing every 5,696 h, "
                        "Llama 3's: costs/goodput.py)")
    p.add_argument("--resume", action="store_true",
                   help="continue from --checkpoint-dir (every stage's checkpoint is checked first)")
    p.add_argument("--elastic", action="store_true",
                   help="with a fallback ladder as --plan and --checkpoint-dir: when a rank is lost, carry on from the "
                        "last checkpoint under the ladder's next rung on the ranks left (under torchrun: the rung of "
                        "the world torchrun's elastic agent restarts with)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a rank gives up on a dead peer")
    p.add_argument("--compare", action="store_true", help="predicted vs measured iteration time, both timelines")
    p.add_argument("--cluster", default=None,
                   help="for --compare: the cluster to simulate on (default: the plan's cluster)")
    p.add_argument("--profile", default=None, help="for --compare: measured costs (paraplan profile)")
    p.add_argument("--overheads", default=None,
                   help="for --compare: the runtime's overheads measured by an earlier run (its overheads.json; "
                        "default: the --cluster's own if it was calibrated, else the measurement shipped for this "
                        "kind of machine)")
    add_sizes(p)
    from paraplan.cli.machine import add_calibration_flag

    add_calibration_flag(p)
    p.add_argument("--data", default=None, metavar="PATH",
                   help="train on real data (default: synthetic batches): a token file of flat ids (nanoGPT's "
                        "train.bin) for a language model, or an .npz with arrays 'inputs' and 'labels' "
                        "(docs/runtime.md)")
    p.add_argument("--data-dtype", choices=("uint16", "uint32"), default="uint16",
                   help="the width of each token id in a --data token file")
    p.add_argument("--print-launch", action="store_true",
                   help="print the torchrun command of each node and a Slurm batch script that run this plan on "
                        "--nodes machines (the other options passed on), and exit without starting anything")
    p.add_argument("--nodes", type=int, default=None, help="with --print-launch: machines (default: 1)")
    p.add_argument("--gpus-per-node", type=int, default=None,
                   help="with --print-launch: processes (GPUs) per machine (default: the plan's devices / --nodes)")
    p.add_argument("--master", default=None,
                   help="with --print-launch: the first machine's address, which hosts the rendezvous "
                        "(default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=None, help="with --print-launch: the rendezvous port (default: 29500)")
    p.add_argument("--slurm", action="store_true", help="with --print-launch: print only the Slurm batch script")
    p.set_defaults(func=run, train_parser=p)  # the parser: --print-launch passes on what differs from its defaults


def _data_check(check, *args):
    """runtime/rank/data.py's and launch_script.py's checks name the field (data_dtype, gpus_per_node);
    here it is the flag."""
    try:
        return check(*args)
    except FieldError as exc:
        raise ParaplanError(f"--{exc.field.replace('_', '-')}: {exc.detail}") from None


def run(args) -> int:
    from paraplan.plans.ladder_file import read_plan_or_rung

    if args.elastic:
        from paraplan.cli.train_elastic import run_elastic

        return run_elastic(args, run_plan)
    plan = read_plan_or_rung(args.plan, args.rung)
    if args.print_launch or _launch_flags_given(args):
        return _print_launch(args, plan)
    return run_plan(args, plan)


def run_plan(args, plan) -> int:
    """`paraplan train` of one plan, once --plan is read (an elastic run calls it once a rung)."""
    from paraplan.runtime.launcher.launch import default_run_dir
    from paraplan.workload import attention_here, cost_model, measured_model

    model = args.model or plan.model
    if args.checkpoint_every == "auto" and not args.checkpoint_dir:  # before any work
        raise ParaplanError("--checkpoint-every auto: needs --checkpoint-dir")
    out_dir = args.out_dir or str(default_run_dir())  # ./runs/<date>-<time>, printed
    # every check before any work: where results go, the comparison's cluster, the checkpoints
    check_outputs(args, out_dir)
    config = _config(args, plan, model, out_dir)
    compare_cluster, overheads = _comparison(args, plan)
    # measured as this machine's ranks will run it: the plan's precision, PyTorch's attention kernel here
    built, spec = measured_model(model, seq_len=args.seq_len, image_size=args.image_size, watch=BARS,
                                 precision=plan.precision, attention=attention_here())
    if args.checkpoint_every == "auto":
        config = auto_interval(args, config, plan, spec)
    world, torchrun = _check_model(args, config, plan, model, built, spec, compare_cluster)
    predicted_memory, breakdowns, by_rank, graph = _predicted_memory(plan, built, spec, world)
    cm = cost_model(spec, compare_cluster, profile=args.profile, overheads=overheads, precision=plan.precision,
                    **({"operators": graph} if graph is not None else {})) if args.compare else None
    if not _launch(args, config, world, out_dir, torchrun):
        return 0  # a torchrun rank other than 0: rank 0 reports
    _report(args, plan, out_dir, cm, compare_cluster, overheads, predicted_memory, breakdowns, by_rank)
    return 0


_LAUNCH_FLAGS = {"nodes", "gpus_per_node", "master", "port", "slurm"}
# not passed on to the nodes: the launch's own flags, and --nproc (under torchrun the launch sets the world)
_NOT_PASSED_ON = {*_LAUNCH_FLAGS, "print_launch", "plan", "nproc", "func", "command", "train_parser"}


def _launch_flags_given(args) -> list[str]:
    return [f"--{d.replace('_', '-')}" for d in sorted(_LAUNCH_FLAGS)
            if getattr(args, d) is not None and getattr(args, d) is not False]


def _print_launch(args, plan) -> int:
    """--print-launch: the commands that run the plan on --nodes machines, with every option given
    besides the launch's (those that differ from their defaults); nothing starts."""
    from paraplan.runtime.launcher.launch_script import launch_text, make_launch

    if not args.print_launch:
        raise ParaplanError(f"{', '.join(_launch_flags_given(args))}: only with --print-launch")
    options = []
    for dest, value in vars(args).items():
        if dest in _NOT_PASSED_ON or value is None or value is False or value == args.train_parser.get_default(dest):
            continue
        options += [f"--{dest.replace('_', '-')}", *([] if value is True else [str(value)])]
    launch = _data_check(lambda: make_launch(len(plan.devices), args.plan, nodes=args.nodes,
                                             gpus_per_node=args.gpus_per_node, master=args.master, port=args.port,
                                             train_options=options))
    print(launch_text(launch, slurm_only=args.slurm), end="")
    return 0


def _config(args, plan, model: str, out_dir: str):
    """The run's TrainConfig (validated once), after the data file and before the checkpoints."""
    import os

    from paraplan.runtime.config import TrainConfig
    from paraplan.runtime.rank.data import check_file
    from paraplan.runtime.state.checkpoints import check_resume

    if args.data:  # the file alone first: a missing one fails before the model is measured
        _data_check(check_file, args.data, args.data_dtype)
    config = TrainConfig(plan=plan, model=model, steps=args.steps, seed=args.seed, lr=args.lr,
                         optimizer=args.optimizer, clip_norm=args.clip_norm, out_dir=out_dir, seq_len=args.seq_len,
                         image_size=args.image_size, dropout=not args.no_dropout, checkpoint_dir=args.checkpoint_dir,
                         checkpoint_every=0 if args.checkpoint_every == "auto" else args.checkpoint_every,
                         resume=args.resume, timeout_s=args.timeout,
                         log=not args.json, data=args.data, data_dtype=args.data_dtype)
    if args.resume:
        from paraplan.runtime.state.checkpoints import resume_note

        note = resume_note(config, check_resume(config))
        if note and not args.json and os.environ.get("RANK", "0") == "0":  # under torchrun: rank 0 says it
            print(note)
    return config


def _comparison(args, plan):
    """--compare's cluster (as simulate: the plan's by default) and the runtime's overheads: a
    measurement named on the command line, else the calibrated cluster's own (paraplan
    calibrate), else the one shipped for this kind of machine."""
    from paraplan.hardware import load_cluster
    from paraplan.runtime.measure.compare import read_overheads

    compare_cluster = None
    if args.compare:  # as simulate: `local` is this machine's cached calibration (cli/machine.py), made
        # here if there is none, but never by the ranks of a torchrun launch (one per node would)
        from paraplan.cli.machine import machine_cluster
        from paraplan.runtime.launcher.launch import under_torchrun

        compare_cluster = load_cluster(machine_cluster(args.cluster or plan.cluster, plan.precision,
                                                       skip=args.no_calibration or bool(args.profile or args.overheads),
                                                       make=not under_torchrun()))
    if args.overheads:
        overheads = read_overheads(args.overheads)
    elif compare_cluster is not None and compare_cluster.overheads is not None:
        overheads = compare_cluster.overheads
    else:
        overheads = read_overheads()
    return compare_cluster, overheads


def _check_model(args, config, plan, model: str, built, spec, compare_cluster) -> tuple[int, bool]:
    """The data, the ranks and the loss against the built model; the comparison's cluster against
    the plan. Returns the world size and whether torchrun started this process."""
    import os

    from paraplan.runtime.launcher.launch import check_before_launch, under_torchrun
    from paraplan.runtime.launcher.preflight import check_model_fits_loss
    from paraplan.runtime.rank.data import check_data

    if args.data:  # against the model, the whole file read once; before any directory or rank
        _data_check(check_data, args.data, args.data_dtype, built.inputs, model)
    torchrun = under_torchrun()
    world = int(os.environ["WORLD_SIZE"]) if torchrun else (len(plan.devices) if args.nproc is None else args.nproc)
    layers = built.layers()
    check_before_launch(config, world, spec.n_layers, layers, built)
    check_model_fits_loss(built, plan, layers, args.seed)  # the loss takes what the model returns
    if compare_cluster is not None:  # before the run, not after it: the comparison simulates on this cluster
        from paraplan.plans.plan import check_fits

        check_fits(plan, spec.n_layers, compare_cluster.n_devices, f"--cluster {compare_cluster.name}")
    return world, torchrun


def _predicted_memory(plan, built, spec, world: int):
    """The plan's memory on this machine, refused before launch when it does not fit; an operator
    placement's is counted on the operator graph (returned too, for the comparison)."""
    from paraplan.costs.memory import out_of_memory_reason, plan_memory, share_breakdowns
    from paraplan.hardware import load_cluster
    from paraplan.workload import cost_model, operator_graph

    local = load_cluster("local")
    capacities = {d: local.device(0).memory_bytes for d in range(world)}
    graph = None
    if plan.kind is PlanKind.OPERATORS:  # an operator placement: its memory is counted on the operator graph
        from paraplan.simulator.predict import simulate_plan

        graph = operator_graph(built, watch=BARS)
        predicted_memory = simulate_plan(plan, cost_model(spec, local, operators=graph,
                                                                precision=plan.precision)).prediction.memory
        breakdowns = ()
    else:
        predicted_memory, breakdowns = plan_memory(plan, spec, capacities, device_kind=local.device(0).name)
    reason = out_of_memory_reason(predicted_memory)
    if reason:
        raise ParaplanError(f"the plan does not fit this machine: {reason}")
    # a stage whose devices take unequal shares of each micro-batch: each rank's own breakdown
    by_rank = {d: b for s, stage in enumerate(plan.stages) if stage.shares and breakdowns
               for d, b in share_breakdowns(plan, spec, s, device_kind=local.device(0).name).items()}
    return predicted_memory, breakdowns, by_rank, graph


def _launch(args, config, world: int, out_dir: str, torchrun: bool) -> bool:
    """Start the ranks (or, under torchrun, be one); False on a torchrun rank other than 0. The
    directories are created only now, and removed again if the run ends before writing anything."""
    import os

    from paraplan.runtime.launcher.launch import run_under_torchrun, spawn
    from paraplan.runtime.state.checkpoints import remove_unlisted
    from paraplan.system.fileio import make_dirs_all, remove_if_empty, remove_temporaries

    created = make_dirs_all(out_dir, args.checkpoint_dir or None)
    clear_rank_files(out_dir)  # a run of another plan here before: its ranks' files, some beyond this world
    if not args.out_dir and not args.json and (not torchrun or os.environ["RANK"] == "0"):
        print(f"writing to {out_dir}", flush=True)
    try:
        if torchrun:
            run_under_torchrun(config)
            if int(os.environ["RANK"]) != 0:
                return False
        else:
            spawn(config, world)
    except BaseException:
        if not torchrun:  # every rank is stopped: what a killed writer left half-written goes
            remove_temporaries(out_dir)
            if args.checkpoint_dir:
                remove_unlisted(args.checkpoint_dir)
        for dirs in created:
            remove_if_empty(dirs)
        raise
    return True


def _report(args, plan, out_dir: str, cm, compare_cluster, overheads, predicted_memory, breakdowns,
            by_rank: dict) -> None:
    """The measured steps, the run's own overheads (overheads.json), the comparison with the
    prediction and the memory per rank: lines, or with --json one document (paraplan.train/2)."""
    import json
    import statistics
    from pathlib import Path

    from paraplan.runtime.measure.compare import (
        against_prediction,
        compare_run,
        measured_overheads,
        step_times,
        write_overheads,
    )

    losses = json.loads((Path(out_dir) / "losses.json").read_text())
    per_step = step_times(out_dir)
    say = (lambda *a: None) if args.json else print  # --json: one JSON document on stdout, nothing else
    summary: dict = {"schema": "paraplan.train/2", "out_dir": out_dir, "steps": len(losses), "losses": losses,
                     "step_s": per_step, "median_step_s": None, "samples_per_s": None, "compare": None,
                     "memory": []}
    if per_step:
        tail = per_step[1:] or per_step
        summary["median_step_s"] = statistics.median(tail)
        summary["samples_per_s"] = plan.global_batch / statistics.median(tail)
        say(f"{len(losses)} steps, final loss {losses[-1]:.6f}; median step {statistics.median(tail) * 1e3:.1f} ms "
            f"({plan.global_batch / statistics.median(tail):.1f} samples/s) after the first")
    if len(per_step) > 2:  # this run's own overheads, for later predictions (--overheads)
        try:
            write_overheads(measured_overheads(out_dir), Path(out_dir) / "overheads.json")
        except ParaplanError:
            pass  # too few actions to read them off (e.g. a single stage with one micro-batch)
    if args.compare:
        c = compare_run(plan, cm, out_dir)
        summary["compare"] = {"predicted_s": c.predicted_s, "measured_median_s": c.measured_median_s,
                              "measured_q1_s": c.measured_q1_s, "measured_q3_s": c.measured_q3_s, "steps": c.steps,
                              "error": c.error, "cluster": compare_cluster.name}
        summary["compare"]["cost_source"] = cm.source
        say(f"predicted {c.predicted_s * 1e3:.1f} ms (costs: {cm.source}; runtime overheads {overheads.source}); "
            f"measured median {c.measured_median_s * 1e3:.1f} ms (quartiles {c.measured_q1_s * 1e3:.1f}.."
            f"{c.measured_q3_s * 1e3:.1f}, {c.steps} steps): {against_prediction(c.predicted_s, c.measured_median_s)}")
        drift = drift_warning(c.error, cm.source)
        if drift:
            summary["compare"]["warning"] = drift
            print(drift, file=sys.stderr)
    _report_memory(plan, out_dir, predicted_memory, breakdowns, by_rank, summary, say)
    if args.json:
        print(json.dumps(summary, indent=2))


DRIFT = 0.25  # issue 33: a measured step this far from the prediction is worth a line


def drift_warning(error: float, source: str) -> str | None:
    """One line when the measured step differs from the prediction by more than DRIFT (`error`:
    (measured - predicted) / predicted, runtime/measure/compare.py): the machine may have changed or be busy
    (the load average it saw), and what to do."""
    if abs(error) <= DRIFT:
        return None
    import os

    from paraplan.runtime.measure.compare import against_prediction

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    cores = os.cpu_count() or 1
    advice = ("run `paraplan calibrate` to measure this machine" if "calibrated" not in source else
              "if the machine has changed, `paraplan calibrate` measures it again")
    # the run's own ranks are in the load average: more than the cores means something else ran too
    return (f"paraplan: warning: the step {against_prediction(1.0, 1.0 + error)} ({source}); the load average "
            f"was {load:.2f} on {cores} cores{' (something else was running)' if load > cores + 0.5 else ''}: "
            f"{advice}")


def _report_memory(plan, out_dir: str, predicted_memory, breakdowns, by_rank: dict, summary: dict, say) -> None:
    from paraplan.runtime.measure.compare import dag_memory_comparison, memory_comparison

    for row in memory_comparison(breakdowns, out_dir, by_rank):
        summary["memory"].append({"rank": row.rank, "measured_bytes": row.measured_states + row.measured_activations,
                                  "predicted_bytes": row.predicted_states + row.predicted_activations,
                                  "measured_states": row.measured_states, "predicted_states": row.predicted_states,
                                  "measured_activations": row.measured_activations,
                                  "predicted_activations": row.predicted_activations})
        say(f"rank {row.rank} (stage {row.stage}): states {row.measured_states / 2**20:.2f} MiB measured, "
            f"{row.predicted_states / 2**20:.2f} predicted; activations {row.measured_activations / 2**20:.2f} MiB "
            f"measured, {row.predicted_activations / 2**20:.2f} predicted")
    if plan.kind is PlanKind.OPERATORS:
        for rank, measured, predicted in dag_memory_comparison(predicted_memory, out_dir):
            summary["memory"].append({"rank": rank, "measured_bytes": measured, "predicted_bytes": predicted})
            say(f"rank {rank}: {measured / 2**20:.2f} MiB measured (parameters, gradients, optimizer states and "
                f"the peak of saved activations), {predicted / 2**20:.2f} MiB predicted peak")
        say(f"losses, memory and each rank's parameters written to {out_dir}")
    else:
        say(f"losses, timelines, memory and each stage's parameters written to {out_dir}")
