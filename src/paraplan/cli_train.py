"""`paraplan train`: run a plan for real (runtime/), then print the measured steps, memory and the
comparison with the prediction. Split from cli.py, which keeps the argument parsing."""

from __future__ import annotations

from paraplan.cli_args import _check_output
from paraplan.errors import FieldError, ParaplanError

# what a run writes into --out-dir (runtime/stage_loop.py, dag_runtime.py, compare.py): each must be a
# regular file if it is there already (writes never replace a device, a FIFO or a link)
RUN_FILES = ("losses.json", "steps_rank*.json", "timeline_rank*.json", "memory_rank*.json", "memory_dag_rank*.json",
             "stage*.pt", "overheads.json", "measured.trace.json", "simulated.trace.json", "compare.png")


def _data_check(check, *args) -> None:
    """runtime/data.py's checks name the field (data, data_dtype); here it is the flag."""
    try:
        check(*args)
    except FieldError as exc:
        raise ParaplanError(f"--{exc.field.replace('_', '-')}: {exc.detail}") from None


def cmd_train(args) -> int:
    import json as _json
    from pathlib import Path

    from paraplan.cli import _cost_model, _measured_model, _operator_graph
    from paraplan.costs.memory import out_of_memory_reason, plan_memory
    from paraplan.fileio import make_dirs, output_problem, remove_if_empty, remove_temporaries
    from paraplan.hardware import load_cluster
    from paraplan.plan.plan_file import read_plan
    from paraplan.runtime.checkpoints import FILES, check_resume, remove_unlisted
    from paraplan.runtime.compare import measured_overheads, read_overheads, write_overheads
    from paraplan.runtime.data import check_data, check_file
    from paraplan.runtime.launch import check_before_launch, run_under_torchrun, spawn, under_torchrun
    from paraplan.runtime.rank_base import TrainConfig

    plan = read_plan(args.plan)
    model = args.model or plan.model
    from paraplan.runtime.launch import default_run_dir

    out_dir = args.out_dir or str(default_run_dir())  # ./runs/<date>-<time>, printed
    # every check before any work: where results go, the comparison's cluster, the checkpoints
    _check_output("--out-dir", out_dir, directory=True)
    if args.checkpoint_dir and not args.resume:
        _check_output("--checkpoint-dir", args.checkpoint_dir, directory=True)
    for flag, directory, names in (("--out-dir", out_dir, RUN_FILES), ("--checkpoint-dir", args.checkpoint_dir, FILES)):
        problem = output_problem(directory, directory=True, files=names) if directory else None
        if problem:
            raise ParaplanError(f"{flag}: {problem}")
    if args.data:  # the file alone first: a missing one fails before the model is measured
        _data_check(check_file, args.data, args.data_dtype)
    config = TrainConfig(plan=plan, model=model, steps=args.steps, seed=args.seed, lr=args.lr,
                         optimizer=args.optimizer, clip_norm=args.clip_norm, out_dir=out_dir, seq_len=args.seq_len,
                         image_size=args.image_size, dropout=not args.no_dropout, checkpoint_dir=args.checkpoint_dir,
                         checkpoint_every=args.checkpoint_every, resume=args.resume, timeout_s=args.timeout,
                         log=not args.json, data=args.data, data_dtype=args.data_dtype)
    if args.resume:
        check_resume(config)
    compare_cluster = load_cluster(args.cluster or plan.cluster) if args.compare else None  # as simulate
    # the runtime's overheads: a measurement named on the command line, else the calibrated
    # cluster's own (paraplan calibrate), else the one shipped for this kind of machine
    if args.overheads:
        overheads = read_overheads(args.overheads)
    elif compare_cluster is not None and compare_cluster.overheads is not None:
        overheads = compare_cluster.overheads
    else:
        overheads = read_overheads()
    built, spec = _measured_model(model, args.seq_len, args.image_size)
    if args.data:  # against the model, the whole file read once; before any directory or rank
        _data_check(check_data, args.data, args.data_dtype, built.inputs, model)
    torchrun = under_torchrun()
    import os

    world = int(os.environ["WORLD_SIZE"]) if torchrun else (args.nproc or len(plan.devices))
    layers = built.layers()
    check_before_launch(config, world, spec.n_layers, layers)
    from paraplan.runtime.preflight import check_model_fits_loss

    check_model_fits_loss(built, plan, layers, args.seed)  # the loss takes what the model returns
    if compare_cluster is not None:  # before the run, not after it: the comparison simulates on this cluster
        from paraplan.plan.plan import check_fits

        check_fits(plan, spec.n_layers, compare_cluster.n_devices, f"--cluster {compare_cluster.name}")
    local = load_cluster("local")
    capacities = {d: local.device(0).memory_bytes for d in range(world)}
    graph = None
    if plan.schedule == "dag":  # an operator placement: its memory is counted on the operator graph
        from paraplan.costs.model import analytic_cost_model
        from paraplan.simulate.predict import simulate_plan

        graph = _operator_graph(built)
        predicted_memory = simulate_plan(plan, analytic_cost_model(spec, local, operators=graph)).prediction.memory
        breakdowns = ()
    else:
        predicted_memory, breakdowns = plan_memory(plan, spec, capacities, device_kind=local.device(0).name)
    reason = out_of_memory_reason(predicted_memory)
    if reason:
        raise ParaplanError(f"the plan does not fit this machine: {reason}")
    cm = _cost_model(args, spec, compare_cluster, overheads=overheads,
                     **({"operators": graph} if graph is not None else {})) if args.compare else None
    # created only now, and removed again if the run ends before writing anything into them
    created = [make_dirs(out_dir), make_dirs(args.checkpoint_dir) if args.checkpoint_dir else []]
    if not args.out_dir and not args.json and (not torchrun or os.environ["RANK"] == "0"):
        print(f"writing to {out_dir}", flush=True)
    try:
        if torchrun:
            run_under_torchrun(config)
            if int(os.environ["RANK"]) != 0:
                return 0
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
    from paraplan.runtime.compare import compare_run, step_times

    losses = _json.loads((Path(out_dir) / "losses.json").read_text())
    per_step = step_times(out_dir)
    say = (lambda *a: None) if args.json else print  # --json: one JSON document on stdout, nothing else
    summary: dict = {"schema": "paraplan.train/1", "out_dir": out_dir, "steps": len(losses), "losses": losses,
                     "step_s": per_step, "median_step_s": None, "samples_per_s": None, "compare": None,
                     "memory": []}
    if per_step:
        import statistics

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
        say(f"predicted {c.predicted_s * 1e3:.1f} ms ({'profile' if args.profile else 'analytic'} costs, cluster "
            f"{compare_cluster.name}; runtime overheads {overheads.source}); measured median "
            f"{c.measured_median_s * 1e3:.1f} ms (quartiles {c.measured_q1_s * 1e3:.1f}.."
            f"{c.measured_q3_s * 1e3:.1f}, {c.steps} steps); error {c.error:+.1%}")
    from paraplan.runtime.compare import dag_memory_comparison, memory_comparison

    for row in memory_comparison(breakdowns, out_dir):
        summary["memory"].append({"rank": row.rank, "measured_bytes": row.measured_states + row.measured_activations,
                                  "predicted_bytes": row.predicted_states + row.predicted_activations,
                                  "measured_states": row.measured_states, "predicted_states": row.predicted_states,
                                  "measured_activations": row.measured_activations,
                                  "predicted_activations": row.predicted_activations})
        say(f"rank {row.rank} (stage {row.stage}): states {row.measured_states / 2**20:.2f} MiB measured, "
            f"{row.predicted_states / 2**20:.2f} predicted; activations {row.measured_activations / 2**20:.2f} MiB "
            f"measured, {row.predicted_activations / 2**20:.2f} predicted")
    if plan.schedule == "dag":
        for rank, measured, predicted in dag_memory_comparison(predicted_memory, out_dir):
            summary["memory"].append({"rank": rank, "measured_bytes": measured, "predicted_bytes": predicted})
            say(f"rank {rank}: {measured / 2**20:.2f} MiB measured (parameters, gradients, optimizer states and "
                f"the peak of saved activations), {predicted / 2**20:.2f} MiB predicted peak")
        say(f"losses, memory and each rank's parameters written to {out_dir}")
    else:
        say(f"losses, timelines, memory and each stage's parameters written to {out_dir}")
    if args.json:
        print(_json.dumps(summary, indent=2))
    return 0
